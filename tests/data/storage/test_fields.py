"""dare_tf.data.storage.fields: a log's further fields and the time gap, from the CSV
column to the model's inputs: id maps, store lists and example features
against a brute-force recount of the raw log (per-user and time split), the
reader's time-gap buckets, both drivers record for record, the trainer's
choice of fields, and the one-line refusals."""

import csv

import numpy as np
import pytest

from dare_tf.data.storage.fields import time_gap_buckets, time_gap_edges
from dare_tf.data.logs.reader import read_clicks
from dare_tf.data.logs.formats import LogFormat, LogFormatError, log_format_of
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.feeding.pipeline import make_dataset
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import SPLITS, DatasetSpec
from dare_tf.data.storage.id_maps import read_id_map
from tests.data.preparation.test_prepare import TMALL, assert_same_datasets
from tests.programs import run_program

DAY = 86_400
START = 1_700_006_400  # a UTC midnight
FORMAT = LogFormat(name="csv", file_format="csv", header=True, columns=(
    ("user", "visitor"), ("item", "product"), ("category", "cat"), ("time", "ts"), ("field:brand", "brand"),
    ("field:shop", "shop")))
PER_USER = Protocol(min_clicks=20, train_targets=3, stride=2, negatives=2, partitions=3, seed=2, time_gap=True)
TIME = Protocol(split="time", min_clicks=15, negatives=2, partitions=3, seed=2, time_gap=True)
L = 8
pytestmark = pytest.mark.xdist_group("data_fields")  # (one worker prepares the module's datasets)


def field_rows(seed=0, users=30, per_user=40, days=5):
    """Rows `(user, item, category, brand, shop, time)` in a shuffled file order;
    an item's brand and shop are fixed, and items 1..9 have no brand (empty)."""
    rng = np.random.default_rng(seed)
    item_brand, item_shop, item_cat = rng.integers(1, 13, 121), rng.integers(100, 107, 121), rng.integers(1, 6, 121)
    rows = []
    for u in range(users):
        times = np.sort(rng.choice(days * DAY, per_user, replace=False)) + START
        for item, t in zip(rng.integers(1, 121, per_user), times):
            rows.append((500 + u, int(item), int(item_cat[item]), "" if item < 10 else int(item_brand[item]),
                         int(item_shop[item]), int(t)))
    return [rows[i] for i in rng.permutation(len(rows))]


def write_log(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("visitor", "product", "cat", "brand", "shop", "ts"))
        w.writerows(rows)
    return str(path)


def _raw_sequences(rows):
    """Each raw user's rows sorted by time (`(item, brand or -1 - item, shop, time)`)."""
    out = {}
    for user, item, _, brand, shop, t in rows:
        out.setdefault(str(user), []).append((item, brand if brand != "" else -1 - item, shop, t))
    return {u: sorted(s, key=lambda r: r[3]) for u, s in out.items()}


@pytest.fixture(scope="module")
def field_log(tmp_path_factory):
    rows = field_rows()
    return rows, write_log(tmp_path_factory.mktemp("fields") / "log.csv", rows)


@pytest.fixture(scope="module")
def per_user(field_log, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fields") / "per_user")
    return out, prepare(FORMAT, field_log[1], out, PER_USER)


def _bucket(gap):
    """The time gap's bucket, recounted: the number of edges 0, 1, 2, 4, ... at or below the gap (at least 1)."""
    return max(1, sum(1 for e in [0] + [2 ** i for i in range(41)] if e <= gap))


def _check_examples(directory, spec, rows):
    """Every example's fields, time and history fields against the raw log."""
    seqs = _raw_sequences(rows)
    users = read_id_map(directory, "user")
    raw = {n: [int(v) for v in open(f"{directory}/{n}_ids.txt").read().split()] for n in ("brand", "shop")}
    item_raw = [int(v) for v in read_id_map(directory, "item")]
    item_of = {}
    for seq in seqs.values():
        for item, brand, shop, _ in seq:
            item_of[item] = (brand, shop)
    checked = 0
    for split in SPLITS:
        data = InMemorySplit.load(directory, split, max_len=L)
        c, f = data.columns, data.features
        chunked = data.store.histories(c, L, chunk=5)  # assembled 5 examples at a time: the same arrays
        assert chunked.keys() == {k for k in f if k.startswith("hist_")}
        for k, v in chunked.items():
            np.testing.assert_array_equal(v, f[k])
        for n in range(0, len(c["uid"]), 3):
            seq = seqs[users[c["uid"][n] - 1]]
            position = int(c["position"][n])
            target = seq[position] if c["label"][n] == 1 and spec.protocol.get("split", "user") == "user" else None
            if target is None:  # a negative, or a time-split target: by its item and time
                item = item_raw[c["target_item"][n] - 1]
                brand, shop = item_of[item]
            else:
                item, brand, shop, _ = target
                assert item_raw[c["target_item"][n] - 1] == item
            assert raw["brand"][c["target_brand"][n] - 1] == brand
            assert raw["shop"][c["target_shop"][n] - 1] == shop
            before = seq[:position]
            if spec.protocol.get("split", "user") == "user":
                assert c["time"][n] == seq[position][3]
            else:  # the history is every click strictly before the example's time
                assert all(t < c["time"][n] for *_, t in before) and (position == len(seq) or
                                                                       seq[position][3] >= c["time"][n])
            window = [None] * (L - len(before[-L:])) + before[-L:]
            expected_brand = [0 if r is None else r[1] for r in window]
            got_brand = [0 if v == 0 else raw["brand"][v - 1] for v in f["hist_brand"][n]]
            assert got_brand == expected_brand
            assert [0 if v == 0 else raw["shop"][v - 1] for v in f["hist_shop"][n]] == [
                0 if r is None else r[2] for r in window]
            assert f["hist_time_gap"][n].tolist() == [0 if r is None else _bucket(int(c["time"][n]) - r[3])
                                                      for r in window]
            checked += 1
    assert checked > 100


def test_per_user_fields_are_the_logs_values(per_user, field_log):
    """Recounted from the raw CSV: each field's id map (dense ids in order of first
    appearance, an empty brand the item's own `-1 - item`), every stored user's
    lists, every example's target values (a negative's: its item's), its time,
    and each history's fields and time-gap buckets."""
    directory, spec = per_user
    rows = field_log[0]
    assert [f["name"] for f in spec.fields] == ["brand", "shop", "time_gap"]
    assert spec.field("time_gap")["edges"] == time_gap_edges()
    order = [r for seq in _raw_sequences(rows).values() for r in seq]
    firsts = list(dict.fromkeys(brand for _, brand, _, _ in order))
    raw_brands = [int(v) for v in open(f"{directory}/brand_ids.txt").read().split()]
    assert sorted(raw_brands) == sorted(firsts) and spec.field("brand")["vocabulary"] == len(firsts) + 2
    assert min(raw_brands) < 0  # the brandless items' own values
    assert spec.features["store"].keys() == {"uid", "items", "categories", "brand", "shop", "times"}
    _check_examples(directory, spec, rows)


def test_time_split_fields_and_both_drivers(field_log, tmp_path):
    """`--split=time` with fields and the time gap, recounted from the raw CSV; the
    Beam driver writes the same records for both splits."""
    from dare_tf.data.preparation import beam

    memory = str(tmp_path / "memory")
    spec = prepare(FORMAT, field_log[1], memory, TIME)
    assert spec.fields[0]["column"] == "brand"
    _check_examples(memory, spec, field_log[0])
    beam.prepare(FORMAT, field_log[1], str(tmp_path / "beam"), TIME, block_bytes=20_000, buckets=2)
    assert_same_datasets(memory, str(tmp_path / "beam"))
    beam.prepare(FORMAT, field_log[1], str(tmp_path / "beam_user"), PER_USER, block_bytes=20_000, buckets=3)
    prepare(FORMAT, field_log[1], str(tmp_path / "memory_user"), PER_USER)
    assert_same_datasets(str(tmp_path / "memory_user"), str(tmp_path / "beam_user"))


def test_the_stream_assembles_what_memory_does(per_user):
    directory, _ = per_user
    memory = InMemorySplit.load(directory, "val", max_len=L)
    streamed = {k: [] for k in memory.features}
    for features, _ in make_dataset(directory, "val", 64, shuffle=False, deterministic=True, max_len=L):
        for k in streamed:
            streamed[k].append(features[k].numpy())
    for k, v in memory.features.items():
        np.testing.assert_array_equal(np.concatenate(streamed[k]), v, err_msg=k)


def test_time_gap_buckets():
    edges = time_gap_edges()
    gaps = np.array([-5, 0, 1, 2, 3, 4, 86_399, 86_400, 2 ** 41])
    assert time_gap_buckets(gaps, edges).tolist() == [_bucket(g) for g in gaps.tolist()]
    assert time_gap_buckets(gaps, edges).tolist() == [1, 1, 2, 3, 3, 4, 18, 18, 42]
    # The TensorFlow twin takes the same arguments in the same order, any shape.
    from dare_tf.data.storage.fields import time_gap_buckets_tensor

    tensor = time_gap_buckets_tensor(gaps.reshape(3, 3), np.asarray(edges, np.int64))
    assert tensor.numpy().tolist() == time_gap_buckets(gaps, edges).reshape(3, 3).tolist()


def _prepare_program(out, *flags):
    """`python -m data.prepare FLAGS --output_dir=OUT --partitions=2`: its output and spec."""
    result = run_program("data.prepare", *flags, f"--output_dir={out}", "--partitions=2")
    assert result.returncode == 0, result.stderr[-2000:]
    return result, DatasetSpec.load(out)


def test_tmall_preset_reads_seller_and_brand(tmp_path):
    """`--dataset=tmall --fields=seller,brand` on the command line: the store's
    seller of each stored click is the raw log's seller_id."""
    out = str(tmp_path / "tmall")
    result, spec = _prepare_program(out, "--dataset=tmall", "--fields=seller,brand", f"--input={TMALL}")
    assert [(f["name"], f["column"]) for f in spec.fields] == [("seller", "seller_id"), ("brand", "brand_id")]
    assert "seller (" in result.stdout and "brand (" in result.stdout
    clicks = {}
    with open(TMALL, newline="") as f:
        for row in csv.DictReader(f):
            if row["action_type"] == "0":
                clicks.setdefault(row["user_id"], []).append((int(row["time_stamp"]), int(row["seller_id"])))
    data = InMemorySplit.load(out, "test", max_len=1)
    store, users = data.store, read_id_map(out, "user")
    sellers = open(f"{out}/seller_ids.txt").read().split()
    for uid in np.unique(data.columns["uid"])[:20]:
        got = [int(sellers[v - 1]) for v in store.fields["seller"][store.start[uid]: store.start[uid] +
                                                                   store.length[uid]]]
        assert got == [s for _, s in sorted(clicks[users[uid - 1]], key=lambda r: r[0])]


@pytest.mark.parametrize("columns, message", [
    ("user=u,item=i,time=t,field:item=b", "--columns: field:item: a field's name must be an identifier other "
     "than item, category, position, user, uid, items, categories, label, labels, time, times, length, action, "
     "time_gap"),
    ("user=u,item=i,time=t,field:2x=b", "--columns: field:2x: a field's name must be an identifier other than"),
    ("user=u,item=i,time=t,field:a=b,field:c=b", "--columns: field:a=b and field:c=b: one column is given to two "
     "fields"),
    # Issue 45 (11): a field on the category's column, and two roles on one column, were accepted.
    ("user=u,item=i,category=c,time=t,field:brand=c", "--columns: category=c and field:brand=c: one column is "
     "given to two roles"),
    ("user=0,item=0,time=2", "--columns: user=0 and item=0: one column is given to two roles"),
])
def test_bad_field_columns_are_refused_in_one_line(columns, message):
    with pytest.raises(LogFormatError) as e:
        log_format_of(None, "csv", columns, header=True)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_bad_field_values_and_flags_are_refused_in_one_line(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("u,i,t,b\n1,2,3,\n1,4,5,\n2,6,7,\n")
    fmt = log_format_of(None, "csv", "user=u,item=i,time=t,field:brand=b", header=True)
    with pytest.raises(LogFormatError, match=r"^.*empty.csv: field brand \(column 'b'\) is empty in every click "
                                              r"row; drop it from --columns \(--fields\), or fill the column$"):
        prepare(fmt, str(path), str(tmp_path / "out"), Protocol(split="time", min_clicks=1))
    from dare_tf.data.preparation import beam

    with pytest.raises(LogFormatError, match=r"^.*empty.csv: field brand \(column 'b'\) is empty in every click"):
        beam.prepare(fmt, str(path), str(tmp_path / "beam"), Protocol(split="time", min_clicks=1))
    assert read_clicks(str(path), fmt).fields["brand"].tolist() == [-3, -5, -7]  # (a live click may have none)
    path.write_text("u,i,t,b\n1,2,3,x7\n")
    with pytest.raises(ValueError, match=r"empty.csv:2: field:brand \(column 'b'\) is not an id \(an integer >= "
                                         r"0, or empty; string ids: --string_ids\): 'x7'"):
        read_clicks(str(path), fmt)
    with pytest.raises(LogFormatError, match="^--fields=seller,colour: the tmall log has no field 'colour'; its "
                                             "fields: seller, brand$"):
        log_format_of("tmall", None, None, fields=["seller", "colour"])
    with pytest.raises(LogFormatError, match="^--fields reads a preset's further fields"):
        log_format_of(None, "csv", "user=u,item=i,time=t", fields=["brand"])


def test_a_run_reads_the_fields_it_is_given(per_user):
    """The trainer's `--fields`: all of the dataset's by default, none, a subset,
    and a config whose fields do not match spec.json, refused in one line."""
    from dare_tf.training.config import dataset_fields

    _, spec = per_user
    assert [f["name"] for f in dataset_fields(spec, "all")] == ["brand", "shop", "time_gap"]
    assert dataset_fields(spec, "none") == []
    assert dataset_fields(spec, "time_gap, brand") == [
        {"name": "time_gap", "vocabulary": 43, "history_only": True},
        {"name": "brand", "vocabulary": spec.field("brand")["vocabulary"], "history_only": False}]
    with pytest.raises(ValueError, match=r"^fields='colour': the dataset has no field 'colour'; its fields: "
                                         r"\['brand', 'shop', 'time_gap'\]"):
        dataset_fields(spec, "colour")
    with pytest.raises(ValueError, match=r"^fields: the model's field 'brand' \(vocabulary 7, history_only False\) "
                                         r"does not match the dataset's spec.json \(vocabulary \d+, history_only "
                                         r"False; its fields"):
        dataset_fields(spec, "all", [{"name": "brand", "vocabulary": 7}])


@pytest.mark.slow
def test_a_model_trains_on_a_prepared_dataset_with_fields(per_user, tmp_path):
    from dare_tf.training import TrainConfig, train
    from tests.training.common import TINY

    directory, spec = per_user
    results = train(directory, str(tmp_path / "run"), TrainConfig.create(preset="dare", **{
        **TINY, "batch_size": 64, "model_overrides": dict(top_k=4, max_len=L)}))
    assert 0 <= results["test"]["auc"] <= 1
    import json

    config = json.load(open(tmp_path / "run" / "run_config.json"))["model_config"]
    assert [f["name"] for f in config["fields"]] == ["brand", "shop", "time_gap"]


def test_the_action_field_keeps_every_action_as_history(tmp_path):
    """`--dataset=taobao --action_field`, recounted from the raw CSV: the store holds
    every row (pv, buy, cart, fav) in file order; the examples' positive targets
    are the clicks the plain dataset targets (each user's clicks at the protocol's
    offsets), each at its place among all the user's rows, and each history's
    `hist_action` is its rows' actions."""
    from tests.data.preparation.test_prepare import TAOBAO

    out = str(tmp_path / "actions")
    _, spec = _prepare_program(out, "--dataset=taobao", "--action_field", f"--input={TAOBAO}")
    assert spec.fields == [{"name": "action", "vocabulary": 6, "history_only": True, "column": "3"}]
    plain = prepare("taobao", TAOBAO, str(tmp_path / "plain"), Protocol(partitions=2))
    rows = {}
    with open(TAOBAO, newline="") as f:
        for user, item, _, action, _ in csv.reader(f):
            rows.setdefault(user, []).append((int(item), action))
    codes = [("pv", "buy", "cart", "fav")[int(v) - 1] for v in open(f"{out}/action_ids.txt").read().split()]
    targets = {}
    for directory in (out, str(tmp_path / "plain")):
        users, items = read_id_map(directory, "user"), read_id_map(directory, "item")
        for split in SPLITS:
            data = InMemorySplit.load(directory, split, max_len=L)
            c = data.columns
            positive = np.flatnonzero(c["label"] == 1)
            targets.setdefault(directory, set()).update(
                (split, users[c["uid"][n] - 1], int(items[c["target_item"][n] - 1])) for n in positive)
            if directory != out:
                continue
            for n in positive[::5]:
                seq = rows[users[c["uid"][n] - 1]]
                position = int(c["position"][n])
                assert seq[position] == (int(items[c["target_item"][n] - 1]), "pv")  # a click, at its row
                window = [None] * max(L - position, 0) + seq[max(position - L, 0):position]
                assert [0 if v == 0 else codes[v - 1] for v in data.features["hist_action"][n]] == [
                    0 if r is None else r[1] for r in window]
                assert "target_action" not in data.features
    assert targets[out] == targets[str(tmp_path / "plain")] and spec.counts == plain.counts
    assert spec.clicks_stored > plain.clicks_stored and spec.source["clicks"] == plain.source["clicks"]


def test_the_action_field_in_both_drivers_both_splits_and_appended(tmp_path):
    """A generated Taobao-format log with buy/cart/fav rows over 5 days, with
    `--action_field`: the Beam driver writes the in-memory driver's records (per
    user and by time), and days 4 and 5 appended equal all days prepared."""
    import dataclasses

    from dare_tf.data.preparation import beam
    from dare_tf.data.preparation.append import append
    from dare_tf.data.generation.synthetic import SyntheticConfig, write
    from tests.data.preparation.test_append import _days, assert_same_data

    log = str(tmp_path / "log.csv")
    write(SyntheticConfig(users=40, items=300, categories=12, min_length=30, max_length=60, length_median=45, days=5,
                          extra_events=0.3, seed=5), log)
    fmt = log_format_of("taobao", None, None, action_field=True)
    per_user = Protocol(min_clicks=20, train_targets=3, stride=2, partitions=3, seed=1)
    by_time = Protocol(split="time", min_clicks=8, partitions=3, seed=1, time_gap=True)
    for name, protocol in (("user", per_user), ("time", by_time)):
        prepare(fmt, log, str(tmp_path / f"memory_{name}"), protocol)
        beam.prepare(fmt, log, str(tmp_path / f"beam_{name}"), protocol, block_bytes=30_000, buckets=2)
        assert_same_datasets(str(tmp_path / f"memory_{name}"), str(tmp_path / f"beam_{name}"))
    days = sorted({int(line.rsplit(",", 1)[1]) // DAY for line in open(log)})
    prepare(fmt, _days(log, 0, days[-3], tmp_path / "base.csv"), str(tmp_path / "grown"), by_time)
    for day in days[-2:]:
        append(_days(log, day, day, tmp_path / f"{day}.csv"), str(tmp_path / "grown"))
    assert_same_data(str(tmp_path / "memory_time"), str(tmp_path / "grown"))
    with pytest.raises(LogFormatError, match=r"^--action_field keeps every action as a field: it needs an action "
                                             r"column and its values: --actions=VALUE,\.\.\. for a custom log \(a "
                                             r"preset's are known\)$"):
        dataclasses.replace(log_format_of(None, "csv", "user=0,item=1,time=4"), action_field=True)


def test_the_field_schema_owns_names_roles_files_and_buckets():
    """Issue 46: one object answers for a dataset's fields (spec.json's entries) and a
    model's (its BehaviorFields, views of the same entries)."""
    from dare_tf.layers.behavior_fields import BehaviorField
    from dare_tf.data.storage.fields import FieldSchema, time_gap_entry

    entries = [{"name": "brand", "vocabulary": 9, "history_only": False, "column": "5"},
               {"name": "action", "vocabulary": 6, "history_only": True, "column": "3"}, time_gap_entry()]
    schema = FieldSchema.of(entries)
    assert FieldSchema.of(schema.to_spec()) == schema and schema.to_spec() == entries
    assert schema.names == ("brand", "action", "time_gap") and schema.columns == ("brand", "action")
    assert schema.time_gap and schema.edges == time_gap_edges()
    assert schema.inputs("hist") == ["hist_brand", "hist_action", "hist_time_gap"]
    assert schema.inputs("target") == ["target_brand"] and schema.inputs("candidate") == ["candidate_brand"]
    assert schema.keys("candidate") == ["hist_brand", "hist_action", "hist_time_gap", "candidate_brand"]
    assert [FieldSchema.field_of(k) for k in schema.keys()] == ["brand", "action", "time_gap", "brand"]
    assert schema.files() == ("brand_ids.txt", "item_brand.txt", "action_ids.txt")
    gaps = np.array([-5, 0, 1, 3, 1 << 20])
    assert schema.buckets_tensor(gaps).numpy().tolist() == [_bucket(g) for g in gaps.tolist()]
    model = FieldSchema.of([BehaviorField(e["name"], e["vocabulary"], history_only=e["history_only"]) for e in entries])
    assert model.keys() == schema.keys() and model.columns == schema.columns
    with pytest.raises(ValueError, match=r"^fields: 'brand' is not a field input \(hist_<field>, target_<field> or "):
        FieldSchema.field_of("brand")
    with pytest.raises(ValueError, match=r"^role 'history': one of \('hist', 'target', 'candidate'\)$"):
        schema.inputs("history")
    assert not FieldSchema().time_gap and FieldSchema().edges is None and FieldSchema().keys() == []
