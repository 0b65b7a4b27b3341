"""dare_tf/data/storage/records.py and the TFRecord layout: plain TensorFlow reads what
preparation writes, the encoder against `tf.train.Example`, partitions, id and
spec.json checks."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.feeding.pipeline import make_dataset
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.records import ShardError, ShardReader, ShardWriter, read_shard, read_shards
from dare_tf.data.storage.schema import EXAMPLE_TIME, STORE_TIMES
from dare_tf.data.storage.spec import DatasetSpec, SpecError
from dare_tf.data.storage.shards import partition_of
from dare_tf.data.storage.wire import encode_examples, encode_store
from tests.conftest import TAOBAO_LOG as TAOBAO



@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("records") / "taobao")
    return out, prepare("taobao", TAOBAO, out, Protocol(seed=1, partitions=4))


def test_encoder_writes_what_tf_train_example_parses():
    rng = np.random.default_rng(0)
    n = 500
    columns = {k: rng.integers(0, 2 ** rng.integers(1, 63, n), dtype=np.int64)
               for k in ("uid", "position", "target_item", "target_category", "label")}
    columns["uid"][:4] = [0, 127, 128, 2**63 - 1]  # varint edges
    for i, record in enumerate(encode_examples(columns)):
        example = tf.train.Example.FromString(record)
        assert {k: list(v.int64_list.value) for k, v in example.features.feature.items()} == {
            k: [int(v[i])] for k, v in columns.items()}
    lengths = np.array([0, 1, 300, 2])
    items, categories = rng.integers(1, 2**40, lengths.sum()), rng.integers(1, 100, lengths.sum())
    start = 0
    for i, record in enumerate(encode_store(np.array([3, 2**31, 5, 6]), lengths, items, categories)):
        feature = tf.train.Example.FromString(record).features.feature
        assert list(feature["uid"].int64_list.value) == [[3, 2**31, 5, 6][i]]
        assert list(feature["items"].int64_list.value) == items[start: start + lengths[i]].tolist()
        assert list(feature["categories"].int64_list.value) == categories[start: start + lengths[i]].tolist()
        start += lengths[i]


@pytest.mark.parametrize("seed", range(4))
def test_any_key_and_value_length_encodes_as_protobuf_does(seed):
    """Every nested length is a varint: keys of 1 to 300 characters (entries past
    127 and 255 bytes) and negative values (10-byte varints) parse back, and each
    record is as long as protobuf's serialization of the same Example (whose map
    order protobuf leaves unspecified)."""
    rng = np.random.default_rng(seed)
    names = ["".join(rng.choice(list("abcdefgh_"), rng.integers(1, 300))) for _ in range(rng.integers(1, 5))]
    names = list(dict.fromkeys(names))
    n = int(rng.integers(1, 40))
    columns = {k: rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64) // 2 ** rng.integers(0, 63, n)
               for k in names}
    for i, record in enumerate(encode_examples(columns)):
        expected = tf.train.Example()
        for k in names:
            expected.features.feature[k].int64_list.value.append(int(columns[k][i]))
        assert tf.train.Example.FromString(record) == expected, (i, [len(k) for k in names])
        assert len(record) == expected.ByteSize()


def test_a_reader_verifies_each_shard_once_and_owns_its_set(prepared, monkeypatch):
    directory, spec = prepared
    reader, names = ShardReader(), spec.shards["val"] + spec.store
    reader.verify(directory, spec, names)
    assert reader.verified == {(os.path.realpath(os.path.join(directory, n)), spec.files[n]["sha256"]) for n in names}
    monkeypatch.setattr(reader, "read_shards", lambda *args: pytest.fail("a verified shard was read again"))
    reader.verify(directory, spec, names)
    assert ShardReader().verified == set()


def test_plain_tensorflow_reads_the_dataset_as_the_readme_shows(prepared):
    """The README's reader: spec.json's file lists and feature spec, tf.data and
    tf.io.parse_example only."""
    data_dir, spec = prepared
    with open(f"{data_dir}/spec.json") as f:
        meta = json.load(f)
    features = {k: tf.io.FixedLenFeature([], tf.int64) for k in meta["features"]["examples"]}
    ds = tf.data.TFRecordDataset([f"{data_dir}/{n}" for n in meta["shards"]["train"]],
                                 compression_type=meta["compression"])
    ds = ds.batch(1024).map(lambda s: tf.io.parse_example(s, features))
    columns = {k: np.concatenate([b[k].numpy() for b in ds]) for k in features}
    ours = InMemorySplit.load(data_dir, "train").columns
    for k, v in ours.items():
        np.testing.assert_array_equal(columns[k], v)
    assert len(columns["uid"]) == spec.counts["train"]
    store = tf.data.TFRecordDataset([f"{data_dir}/{n}" for n in meta["store"]], compression_type=meta["compression"])
    ragged = {"uid": tf.io.FixedLenFeature([], tf.int64), "items": tf.io.RaggedFeature(tf.int64),
              "categories": tf.io.RaggedFeature(tf.int64)}
    clicks = sum(int(b["items"].flat_values.shape[0]) for b in store.batch(64).map(
        lambda s: tf.io.parse_example(s, ragged)))
    assert clicks == spec.clicks_stored
    names = sorted(os.listdir(data_dir))
    assert "train-00003-of-00004.tfrecord.gz" in names and "store-00000-of-00004.tfrecord.gz" in names


def test_shard_k_holds_the_examples_of_store_shard_ks_users(prepared):
    data_dir, spec = prepared
    for k in range(spec.partitions):
        store = read_shard(data_dir, spec.store[k], spec, "store")
        assert (partition_of(store["uid"], spec.partitions) == k).all()
        for split in ("train", "val", "test"):
            examples = read_shard(data_dir, spec.shards[split][k], spec, split)
            assert set(examples["uid"].tolist()) <= set(store["uid"].tolist())
    sizes = [spec.records(n) for n in spec.store]
    assert sum(sizes) == spec.users and min(sizes) > 0


def test_uncompressed_files_hold_the_same_records(prepared, tmp_path):
    data_dir, spec = prepared
    plain = prepare("taobao", TAOBAO, str(tmp_path / "plain"), Protocol(seed=1, partitions=4), compression="")
    assert plain.compression == "" and plain.store[0] == "store-00000-of-00004.tfrecord"
    assert sum(f["bytes"] for f in plain.files.values()) > 2 * sum(f["bytes"] for f in spec.files.values())
    for split in ("val", "test"):
        a = InMemorySplit.load(data_dir, split).features
        b = InMemorySplit.load(str(tmp_path / "plain"), split).features
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def _rewrite_shard(data_dir, name, kind, columns):
    """Replaces shard `name` by `columns` and records it in spec.json as preparation would."""
    spec_path = os.path.join(data_dir, "spec.json")
    raw = json.load(open(spec_path))
    writer = ShardWriter(os.path.join(data_dir, name), raw["compression"])
    writer.write(encode_examples(columns) if kind != "store" else encode_store(**columns))
    raw["files"][name].update(writer.close())
    if kind in raw["counts"]:
        raw["counts"][kind] = sum(raw["files"][n]["records"] for n in raw["shards"][kind])
    json.dump(raw, open(spec_path, "w"))


@pytest.mark.parametrize("feature,value,expected", [
    ("target_item", 10**9, "expected spec.json's item ids 1..{items}"),
    ("target_category", -4, "expected spec.json's category ids 1..{categories}"),
    ("uid", 0, "expected spec.json's user ids 1..{users}"),
    ("position", -1, "expected a position >= 0"),
    ("label", 2, "expected a label 0 or 1"),
])
def test_out_of_range_ids_are_refused_naming_file_feature_and_value(prepared, tmp_path, feature, value, expected):
    data_dir, spec = prepared
    bad = str(tmp_path / "bad")
    shutil.copytree(data_dir, bad)
    name = spec.shards["val"][1]
    columns = {k: v.astype(np.int64) for k, v in read_shard(data_dir, name, spec, "val").items()}
    columns[feature][3] = value
    _rewrite_shard(bad, name, "val", columns)
    message = expected.format(items=spec.num_items - 1, categories=spec.num_categories - 1, users=spec.num_users - 1)
    with pytest.raises(ShardError, match=f"{name}: feature '{feature}' holds {value} \\(value 3 of the shard\\); "
                                         f"{message}"):
        list(make_dataset(bad, "val", 16))


def _keys(batches, n):
    """The first `n` examples of `batches` as (uid, position, target item, label) tuples."""
    out = []
    for x, y in batches:
        out += zip(*(v.numpy().tolist() for v in (x["uid"], x["hist_items"][:, -1], x["target_item"], y)))
        if len(out) >= n:
            return out[:n]
    return out


def test_a_shuffled_stream_mixes_examples_within_blocks_and_reshuffles_each_epoch(prepared):
    """Blocks of consecutive records are shuffled as units (STREAM_BLOCK), then the
    examples of each group of blocks permuted: few neighbours in the shards stay
    neighbours; a repeated stream's second epoch is another order of the same examples."""
    data_dir, spec = prepared
    in_files = _keys(make_dataset(data_dir, "train", 512, shuffle=False), 10**9)
    n = len(in_files)
    position = {k: i for i, k in enumerate(in_files)}
    assert len(position) > 0.95 * n
    shuffled = _keys(make_dataset(data_dir, "train", 512, shuffle=True, deterministic=True, seed=5), n)
    assert sorted(shuffled) == sorted(in_files)
    steps = np.diff([position[k] for k in shuffled])
    assert np.mean(steps == 1) < 0.02, np.mean(steps == 1)
    two = _keys(make_dataset(data_dir, "train", 512, shuffle=True, repeat=True, deterministic=True, seed=5), 2 * n)
    assert two[:n // 2] == shuffled[:n // 2]  # the same seed's order...
    assert sorted(two[n:]) != two[n:] and two[n:] != two[:n]  # ...and then another one
    assert len(set(two[n + n // 10: 2 * n - n // 10]) - set(in_files)) == 0


def test_shards_read_as_one_pipeline_equal_shards_read_one_by_one(prepared, tmp_path):
    """Store shards (ragged clicks) and example shards, an empty shard among them;
    a bad id in one of them is named as when read alone."""
    data_dir, spec = prepared
    tiny = str(tmp_path / "tiny")
    log = tmp_path / "log.csv"
    log.write_text("".join(f"{u},{i},{i % 3 + 1},pv,{1511500000 + i}\n" for u in (1, 2)
                           for i in range(10 * u, 10 * u + 30)))
    for directory, dataset_spec in ((data_dir, spec), (tiny, prepare("taobao", str(log), tiny,
                                                                     Protocol(min_clicks=20, train_targets=2,
                                                                              negatives=0)))):
        for kind, names in (("store", dataset_spec.store), ("train", dataset_spec.shards["train"])):
            together = read_shards(directory, names, dataset_spec, kind)
            alone = [read_shard(directory, name, dataset_spec, kind) for name in names]
            assert len(together) == len(alone) == len(names)
            for a, b in zip(together, alone):
                assert a.keys() == b.keys()
                for k in a:
                    assert a[k].dtype == b[k].dtype == (np.int64 if k in (STORE_TIMES, EXAMPLE_TIME) else np.int32), k
                    np.testing.assert_array_equal(a[k], b[k])
    tiny_spec = DatasetSpec.load(tiny)
    assert min(tiny_spec.records(n) for n in tiny_spec.shards["train"]) == 0  # an empty shard was read
    bad = str(tmp_path / "bad")
    shutil.copytree(data_dir, bad)
    name = spec.shards["test"][2]
    columns = {k: v.astype(np.int64) for k, v in read_shard(data_dir, name, spec, "test").items()}
    columns["target_item"][1] = 2**33  # outside int32 too
    _rewrite_shard(bad, name, "test", columns)
    with pytest.raises(ShardError, match=f"{name}: feature 'target_item' holds {2**33} \\(value 1 of the shard\\)"):
        InMemorySplit.load(bad, "test")


def test_store_ids_are_checked(prepared, tmp_path):
    data_dir, spec = prepared
    bad = str(tmp_path / "bad")
    shutil.copytree(data_dir, bad)
    name = spec.store[2]
    store = read_shard(data_dir, name, spec, "store")
    items = store["items"].astype(np.int64)
    items[5] = spec.num_items + 7
    _rewrite_shard(bad, name, "store", dict(uid=store["uid"], lengths=store["length"], items=items,
                                           categories=store["categories"]))
    with pytest.raises(ShardError, match=f"{name}: feature 'items' holds {spec.num_items + 7} \\(value 5"):
        make_dataset(bad, "val", 16)


@pytest.mark.parametrize("change,message", [
    (lambda raw: [raw], "expected a JSON object, got list"),
    (lambda raw: dict(raw, num_items=2**40), "field 'num_items' must be an integer in \\[1, 2147483647\\], got "
                                             "1099511627776"),
    (lambda raw: dict(raw, max_len=1e8), "field 'max_len' must be an integer in \\[1, 1048576\\], got 100000000.0"),
    (lambda raw: dict(raw, compression="zip"), "field 'compression' must be one of \\['', 'GZIP'\\]"),
    (lambda raw: dict(raw, store=["../outside.tfrecord.gz"] + raw["store"][1:]),
     "field 'store\\[0\\]' must be a shard file name like 'store-00000-of-00004.tfrecord.gz' \\(inside the dataset"),
    (lambda raw: dict(raw, shards=dict(raw["shards"], test=raw["shards"]["test"][:2])),
     "field 'shards.test' must be a list of 4 shard names"),
    (lambda raw: dict(raw, counts=dict(raw["counts"], val=7)), "field 'counts.val' must be the number of records"),
    # a split that lists another split's shards (training on the test set) is refused
    (lambda raw: dict(raw, shards=dict(raw["shards"], train=raw["shards"]["test"]),
                      counts=dict(raw["counts"], train=raw["counts"]["test"])),
     "field 'shards.train\\[0\\]' must be a shard file name like 'train-00000-of-00004.tfrecord.gz'"),
])
def test_spec_json_is_validated(prepared, tmp_path, change, message):
    data_dir, _ = prepared
    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    raw = json.load(open(bad / "spec.json"))
    (bad / "spec.json").write_text(json.dumps(change(raw)))
    with pytest.raises(SpecError, match=f"spec.json: {message}"):
        DatasetSpec.load(str(bad))
