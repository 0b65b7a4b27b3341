"""dare_tf.data.storage.wire: store and example shards read with numpy (how
`dare_tf.data.storage.records` reads them, with or without TensorFlow loaded) give
the columns `tf.io.parse_example` gives (gzip or not, with further fields and
times; example records with a key's bytes inside a value read record by record),
and `data.prepare --append` runs without loading TensorFlow."""

import subprocess
import sys

import numpy as np
import pytest

from dare_tf.data.preparation.protocol import Protocol

from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.shards import STORE_KIND
from dare_tf.data.storage.wire import decode_varints, encode_examples, parse_examples, parse_store
from tests.conftest import REPO
from tests.data.preparation.test_append import DAY, _day_numbers, _days
from tests.data.storage.test_fields import FORMAT, field_rows, write_log
from tests.data.preparation.test_prepare import TAOBAO


def tensorflow_columns(paths: list[str], spec: DatasetSpec, kind: str) -> dict[str, np.ndarray]:
    """The reference: the records of `paths` parsed by tf.data and `tf.io.parse_example`
    (`records.feature_spec`), as plain TensorFlow reads them, into int64 columns."""
    import tensorflow as tf

    from dare_tf.data.storage.records import feature_spec

    parts: dict[str, list] = {}
    for serialized in tf.data.TFRecordDataset(paths, compression_type=spec.compression).batch(1 << 16):
        for k, v in tf.io.parse_example(serialized, feature_spec(kind, spec)).items():
            if k == spec.record_columns[1][0]:  # every user's clicks: its length once
                parts.setdefault("length", []).append(v.row_lengths().numpy())
            parts.setdefault(k, []).append((v.flat_values if isinstance(v, tf.RaggedTensor) else v).numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


def test_packed_varints_decode_as_int64_including_negatives_and_large_values():
    from dare_tf.data.storage.wire import _varints

    values = np.array([0, 1, 127, 128, 300, 2**35, 2**62, 2**63 - 1, -1, -2**63, -987654321], np.int64)
    data, used = _varints(values)
    payload = data[np.arange(data.shape[1])[None, :] < used[:, None]].tobytes()
    np.testing.assert_array_equal(decode_varints(payload), values)
    assert decode_varints(b"").shape == (0,)


@pytest.mark.parametrize("kind", ["taobao", "fields"])
def test_store_shards_parse_as_tensorflow_parses_them(kind, tmp_path):
    if kind == "taobao":
        spec = prepare("taobao", TAOBAO, str(tmp_path / "d"), Protocol(min_clicks=100, partitions=3))
    else:  # further fields, the clicks' times, uncompressed
        spec = prepare(FORMAT, write_log(tmp_path / "log.csv", field_rows()), str(tmp_path / "d"),
                       Protocol(min_clicks=20, train_targets=2, stride=2, time_gap=True, partitions=2),
                       compression="")
    spec = DatasetSpec.load(str(tmp_path / "d"))
    paths = [str(tmp_path / "d" / name) for name in spec.store]
    expected = tensorflow_columns(paths, spec, STORE_KIND)
    got = parse_store(paths, spec.compression, spec.record_columns[1])
    assert sorted(got) == sorted(expected) and len(got["uid"]) == spec.users
    for name, values in expected.items():
        np.testing.assert_array_equal(got[name], values, err_msg=name)


@pytest.mark.parametrize("kind", ["taobao", "fields"])
def test_example_shards_parse_as_tensorflow_parses_them(kind, tmp_path):
    """Issue 60 (2): the trainer on JAX reads the example shards with the package's own decoder."""
    if kind == "taobao":
        prepare("taobao", TAOBAO, str(tmp_path / "d"), Protocol(min_clicks=100, partitions=3))
    else:  # further fields' targets and the examples' times, uncompressed
        prepare(FORMAT, write_log(tmp_path / "log.csv", field_rows()), str(tmp_path / "d"),
                Protocol(min_clicks=20, train_targets=2, stride=2, time_gap=True, partitions=2), compression="")
    spec = DatasetSpec.load(str(tmp_path / "d"))
    for split in ("train", "val", "test"):
        paths = [str(tmp_path / "d" / name) for name in spec.shard_files(split)]
        expected = tensorflow_columns(paths, spec, split)
        got = parse_examples(paths, spec.compression, spec.record_columns[0])
        assert sorted(got) == sorted(expected) and len(got["uid"]) == spec.counts[split]
        for name, values in expected.items():
            np.testing.assert_array_equal(got[name], values, err_msg=f"{split} {name}")


def test_a_record_holding_a_key_twice_is_read_record_by_record(tmp_path):
    """Two serialized Examples back to back are one Example (protobuf merges them; a key
    given twice keeps its last value): the all-at-once search finds one entry too many,
    so the records are read one by one, as TensorFlow reads them."""
    import tensorflow as tf

    merged = encode_examples({"uid": np.array([5]), "label": np.array([1])})[0] + \
        encode_examples({"label": np.array([0])})[0]
    records = [merged, *encode_examples({"uid": np.array([2**40]), "label": np.array([1])})]
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    got = parse_examples([path], "", ("uid", "label"))
    expected = tf.io.parse_example(records, {k: tf.io.FixedLenFeature([], tf.int64) for k in ("uid", "label")})
    for name in ("uid", "label"):
        np.testing.assert_array_equal(got[name], expected[name].numpy(), err_msg=name)
    np.testing.assert_array_equal(got["label"], [0, 1])


def test_an_append_runs_without_loading_tensorflow(tmp_path):
    days = _day_numbers(TAOBAO)
    base = _days(TAOBAO, 0, days[-2], tmp_path / "base.csv")
    prepare("taobao", base, str(tmp_path / "d"), Protocol(split="time", min_clicks=50, partitions=3, seed=4))
    day = _days(TAOBAO, days[-1], days[-1], tmp_path / "day.csv")
    probe = ("import runpy, sys\nsys.argv = ['data.prepare', '--append', sys.argv[1], sys.argv[2]]\n"
             "try:\n    runpy.run_module('data.prepare', run_name='__main__', alter_sys=True)\n"
             "except SystemExit as e:\n    assert not e.code, e.code\n"
             "print('loaded', 'tensorflow' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe, f"--input={day}", f"--output_dir={tmp_path / 'd'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr.strip().splitlines()[-1] == "loaded False", done.stderr[-2000:]
    spec = DatasetSpec.load(str(tmp_path / "d"))
    assert len(spec.source["appended"]) == 1 and spec.source["last_time"] // DAY == days[-1]


def test_a_record_cut_short_is_named_not_read_short(tmp_path):
    """A TFRecord file (uncompressed) whose last record was cut short: `tfrecords` raises
    EOFError saying where, which the checked reader names with the file (before, the
    short record was returned as it was)."""
    from dare_tf.data.storage.records import ShardWriter
    from dare_tf.data.storage.wire import tfrecords

    path = str(tmp_path / "x.tfrecord")
    writer = ShardWriter(path, "")
    writer.write(encode_examples({"uid": np.arange(3), "label": np.ones(3, np.int64)}))
    writer.close()
    whole = open(path, "rb").read()
    assert len(tfrecords(path, "")) == 3
    open(path, "wb").write(whole[:-5])
    with pytest.raises(EOFError) as cut:
        tfrecords(path, "")
    record = len(whole) // 3
    assert str(cut.value) == f"the record at byte {2 * record} ends past the file's end, byte {len(whole) - 5}"
