"""dare_tf/data/logs/formats.py and `data.prepare` on any log: custom CSV/TSV/Parquet click
logs, impression logs, presets as instances of the same reader, and bad input."""

import os
import re

import numpy as np
import pytest

from dare_tf.data.logs.formats import BadLineError, LogFormat, LogFormatError
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.id_maps import read_id_map
from tests.conftest import TAOBAO_LOG as TAOBAO, TMALL_LOG as TMALL
from tests.data.planted_logs import impression_log, impression_rows, parquet_clicks
from tests.programs import run_program



def prepare_cli(*args):
    return run_program("data.prepare", *args)


def columns_of(directory, split):
    return InMemorySplit.load(directory, split).columns


@pytest.mark.slow
def test_presets_are_custom_formats_with_identical_protocol_counts(tmp_path):
    """`--dataset=taobao|tmall` against the same logs described by --format/--columns."""
    runs = {
        "taobao": ["--dataset=taobao", f"--input={TAOBAO}"],
        "taobao_custom": ["--format=csv", f"--input={TAOBAO}", "--columns=user=0,item=1,category=2,action=3,time=4",
                          "--click=pv"],
        "tmall": ["--dataset=tmall", f"--input={TMALL}"],
        "tmall_custom": ["--format=csv", "--header", f"--input={TMALL}", "--click=0",
                         "--columns=user=user_id,item=item_id,category=cat_id,time=time_stamp,action=action_type"],
    }
    for name, args in runs.items():
        result = prepare_cli(*args, f"--output_dir={tmp_path / name}", "--seed=1")
        assert result.returncode == 0, result.stderr[-2000:]
    for preset in ("taobao", "tmall"):
        a, b = DatasetSpec.load(str(tmp_path / preset)), DatasetSpec.load(str(tmp_path / f"{preset}_custom"))
        assert a.counts == b.counts and a.users == b.users and a.num_items == b.num_items
        assert b.dataset == "csv" and b.source["log"]["columns"][0] == ["user", "user_id" if preset == "tmall" else "0"]
        for split in ("train", "test"):
            x, y = columns_of(str(tmp_path / preset), split), columns_of(str(tmp_path / f"{preset}_custom"), split)
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
    assert a.counts == {"train": 120 * 19 * 3, "val": 360, "test": 360}


@pytest.mark.parametrize("file_format", ["csv", "tsv"])
def test_impression_log_examples_are_its_impressions_split_by_time(tmp_path, file_format):
    """Recounted from the raw rows: per user, impressions ordered by time; the last
    is test, the one before validation, the rest train, each with its own label and
    the user's clicks strictly before its time as history."""
    fmt, path, protocol = impression_log(tmp_path, file_format)
    out = str(tmp_path / "out")
    spec = prepare(fmt, path, out, protocol)
    rows = impression_rows()
    per_user = {}
    for order, (u, i, c, t, y) in enumerate(rows):
        per_user.setdefault(u, []).append((t, order, i, c, y))
    per_user = {u: sorted(r) for u, r in per_user.items()}
    qualifying = {u for u, r in per_user.items() if sum(y for *_, y in r) >= 3}
    assert spec.users == len(qualifying)
    assert spec.counts == {"train": sum(len(per_user[u]) - 2 for u in qualifying), "val": len(qualifying),
                           "test": len(qualifying)}
    assert spec.source["clicks"] == sum(r[4] for r in rows)
    raw_users, raw_items = read_id_map(out, "user"), read_id_map(out, "item")
    expected_split = {"train": lambda r: r[:-2], "val": lambda r: r[-2:-1], "test": lambda r: r[-1:]}
    for split, pick in expected_split.items():
        data = InMemorySplit.load(out, split, max_len=50)
        c, x = data.columns, data.features
        got = {}
        for n in range(len(c["uid"])):
            user = int(raw_users[c["uid"][n] - 1])
            history = [int(raw_items[i - 1]) for i in x["hist_items"][n] if i]
            got.setdefault(user, []).append((int(raw_items[c["target_item"][n] - 1]), int(c["label"][n]), history))
        for user in qualifying:
            impressions = pick(per_user[user])
            clicks = [r for r in per_user[user] if r[4] == 1]
            expected = [(i, y, [ci for ct, _, ci, _, _ in clicks if ct < t][-50:]) for t, _, i, _, y in impressions]
            assert got[user] == expected, (split, user)


def test_log_without_category_column_gets_one_category_and_parquet_reads(tmp_path):
    fmt, path, protocol = parquet_clicks(tmp_path)
    spec = prepare(fmt, path, str(tmp_path / "out"), protocol)
    assert spec.num_categories == 3  # padding, the one category, out-of-vocabulary
    assert spec.source["rows"] == 480 and spec.dataset == "parquet"
    test = InMemorySplit.load(str(tmp_path / "out"), "test")
    assert set(test.columns["target_category"].tolist()) == {1}
    assert len(test) == spec.users * 3


def _csv(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


HEADER = "user,item,cat,ts,clicked\n"
BODY = "".join(f"{u},{i},{i % 4},{100 + i},{i % 2}\n" for u in (1, 2, 3) for i in range(10))
IMPRESSIONS = LogFormat(name="csv", file_format="csv", header=True, columns=(
    ("user", "user"), ("item", "item"), ("category", "cat"), ("time", "ts"), ("label", "clicked")))
SMALL = Protocol(min_clicks=2, partitions=2)


def test_bad_custom_logs_are_named(tmp_path):
    out = str(tmp_path / "out")
    good = _csv(tmp_path, "good.csv", HEADER + BODY)
    assert prepare(IMPRESSIONS, good, out, SMALL).users == 3
    missing = LogFormat(name="csv", file_format="csv", header=True, columns=(
        ("user", "user"), ("item", "product"), ("time", "ts"), ("label", "clicked")))
    with pytest.raises(LogFormatError, match="--columns: item=product: .*good.csv has no column 'product'; its "
                                             "columns are: user, item, cat, ts, clicked"):
        prepare(missing, good, str(tmp_path / "o"), SMALL)
    no_header = LogFormat(name="csv", file_format="csv", columns=(("user", "0"), ("item", "1"), ("time", "7"),
                                                                  ("label", "4")))
    with pytest.raises(LogFormatError, match=re.escape(
            f"{good}:1: 5 field(s) ('user,item,cat,ts,clicked'), but --columns=time=7 reads field 7 (0-based): a "
            "malformed line, or a field past the line's (pass --header if it names the columns)")):
        prepare(no_header, good, str(tmp_path / "o"), SMALL)
    label = _csv(tmp_path, "label.csv", HEADER + BODY + "4,5,1,200,2\n")
    with pytest.raises(BadLineError, match="label.csv:32: label \\(column 'clicked'\\) must be 0 or 1, got '2'"):
        prepare(IMPRESSIONS, label, str(tmp_path / "o"), SMALL)
    spec = prepare(IMPRESSIONS, label, str(tmp_path / "o"), SMALL, skip_bad_lines=True, max_bad_share=0.1)
    assert spec.source["bad_lines"] == 1
    word = _csv(tmp_path, "word.tsv", HEADER.replace(",", "\t") + BODY.replace(",", "\t") + "4\tx9\t1\t200\t1\n")
    tsv = LogFormat(name="tsv", file_format="tsv", header=True, columns=IMPRESSIONS.columns)
    with pytest.raises(BadLineError, match="word.tsv:32: item \\(column 'item'\\) is not an integer \\(string ids: "
                                           "--string_ids\\): 'x9'"):
        prepare(tsv, word, str(tmp_path / "o"), SMALL)
    with pytest.raises(ValueError, match="empty.csv: input log is empty"):
        prepare(IMPRESSIONS, _csv(tmp_path, "empty.csv", ""), str(tmp_path / "o"), SMALL)
    with pytest.raises(ValueError, match="header.csv: input log has no data rows"):
        prepare(IMPRESSIONS, _csv(tmp_path, "header.csv", HEADER), str(tmp_path / "o"), SMALL)
    # two columns of one name: refused, not read as one column by one parser and another by the other
    twice = _csv(tmp_path, "twice.csv", HEADER.replace("cat", "item") + BODY)
    with pytest.raises(LogFormatError, match="^--columns: item=item: .*twice.csv has 2 columns named 'item' "
                                             "\\(fields 1, 2, 0-based\\); rename them"):
        prepare(IMPRESSIONS, twice, str(tmp_path / "o"), SMALL, skip_bad_lines=True, max_bad_share=0.1)
    assert sorted(os.listdir(tmp_path)) == sorted(["good.csv", "label.csv", "word.tsv", "empty.csv", "header.csv",
                                                   "twice.csv", "out", "o"])


def test_binary_files_and_carriage_returns_are_named_in_one_line(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    body = (HEADER + BODY).encode()
    (tmp_path / "log.csv.gz").write_bytes(gzip.compress(body))
    pq.write_table(pa.table({"user": [1]}), tmp_path / "table.parquet")
    (tmp_path / "mac.csv").write_bytes(body.replace(b"\n", b"\r"))
    stray = HEADER + BODY.replace("2,3,3,103,1\n", "2,3,3,10\r3,1\n")
    (tmp_path / "stray.csv").write_bytes(stray.encode())
    for name, message in [("log.csv.gz", "--format=csv reads text, but this is a gzip file: decompress it first"),
                          ("table.parquet", "--format=csv reads text, but this is a Parquet file: pass "
                                            "--format=parquet"),
                          ("mac.csv", ":1: a carriage return (\\r) inside the first line")]:
        with pytest.raises(LogFormatError, match=re.escape(f"{tmp_path / name}") + f".*{re.escape(message)}"):
            prepare(IMPRESSIONS, str(tmp_path / name), str(tmp_path / "o"), SMALL, skip_bad_lines=True,
                    max_bad_share=0.1)
    with pytest.raises(BadLineError, match=re.escape(f"{tmp_path / 'stray.csv'}:15: a carriage return inside the "
                                                     "line")):
        prepare(IMPRESSIONS, str(tmp_path / "stray.csv"), str(tmp_path / "o"), SMALL)
    spec = prepare(IMPRESSIONS, str(tmp_path / "stray.csv"), str(tmp_path / "o"), SMALL, skip_bad_lines=True,
                   max_bad_share=0.1)
    assert spec.source["bad_lines"] == 1


def test_bad_parquet_logs_are_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    fmt, path, protocol = parquet_clicks(tmp_path)
    table = pq.read_table(path)
    strings = table.set_column(1, "item", pa.array([str(v) for v in table.column("item").to_pylist()]))
    pq.write_table(strings, str(tmp_path / "strings.parquet"))
    with pytest.raises(LogFormatError, match="strings.parquet: column 'item' \\(item\\) has type string; expected "
                                             "an integer type"):
        prepare(fmt, str(tmp_path / "strings.parquet"), str(tmp_path / "o"), protocol)
    negative = table.set_column(0, "user", pa.array([-5] + table.column("user").to_pylist()[1:], pa.int64()))
    pq.write_table(negative, str(tmp_path / "negative.parquet"))
    with pytest.raises(BadLineError, match="negative.parquet: row 1: user \\(column 'user'\\) is negative: '-5'"):
        prepare(fmt, str(tmp_path / "negative.parquet"), str(tmp_path / "o"), protocol)
    # Issue 45 (11): a uint64 id past int64 was reported as negative.
    huge = table.set_column(0, "user", pa.array([2**63 + 5] + table.column("user").to_pylist()[1:], pa.uint64()))
    pq.write_table(huge, str(tmp_path / "huge.parquet"))
    with pytest.raises(BadLineError, match="huge.parquet: row 1: user \\(column 'user'\\) does not fit a 64-bit "
                                           "integer: '9223372036854775813'"):
        prepare(fmt, str(tmp_path / "huge.parquet"), str(tmp_path / "o"), protocol)
    with pytest.raises(LogFormatError, match="clicks.parquet has no column 'cat'; its columns are: user, item, "
                                             "event, ts"):
        prepare(LogFormat(name="parquet", file_format="parquet", columns=fmt.columns + (("category", "cat"),),
                          click="click"), path, str(tmp_path / "o"), protocol)
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.slow
def test_command_line_custom_logs_and_one_line_errors(tmp_path):
    fmt, path, _ = impression_log(tmp_path, "tsv")
    result = prepare_cli("--format=tsv", "--header", f"--input={path}", f"--output_dir={tmp_path / 'imp'}",
                         "--columns=user=visitor,item=product,category=cat,time=ts,label=clicked", "--min_clicks=3",
                         "--partitions=3", "--compression=none")
    assert result.returncode == 0, result.stderr[-2000:]
    spec = DatasetSpec.load(str(tmp_path / "imp"))
    assert spec.compression == "" and spec.partitions == 3 and spec.protocol["min_clicks"] == 3
    cases = [
        (["--dataset=taobao", "--columns=user=0"], 2, "--dataset=taobao is a preset: it cannot be combined with "
                                                      "--columns"),
        (["--format=csv"], 2, "name the log's format: --dataset=taobao|tmall, or --format=csv|tsv|parquet"),
        (["--format=csv", "--columns=user=0,item=1"], 2, "--columns: missing time=COL"),
        (["--format=csv", "--columns=user=0,item=1,time=2,action=3"], 2, "--click=VALUE says which value is a click"),
        (["--format=tsv", "--header", "--columns=user=visitor,item=nope,time=ts"], 1,
         "has no column 'nope'; its columns are: visitor, product, cat, ts, clicked"),
        (["--dataset=taobao", "--negatives=0", "--min_clicks=100000"], 1, "no user has >= 100000 clicks"),
        (["--dataset=taobao", "--negatives=1000"], 2, "--negatives=1000: must be in [0, 100]"),
        (["--dataset=taobao", "--seed=-1"], 2, "--seed=-1: must be in [0, 2^32)"),
        (["--dataset=taobao", "--partitions=0"], 2, "--partitions=0: must be in [1, 1024]"),
        (["--dataset=taobao", "--beam_buckets=4"], 2, "--beam_buckets is for --runner=beam"),
        (["--dataset=taobao", "--runner=beam", "--beam_buckets=0"], 2,
         "flag --beam_buckets=0: 0 is not an integer in the range [1, 1024]"),
        # Issue 59 (4): 20,000 buckets of a 447 KB log wrote 715,535 work files and ran past 240 s.
        (["--dataset=taobao", "--runner=beam", "--beam_buckets=20000"], 2,
         "flag --beam_buckets=20000: 20000 is not an integer in the range [1, 1024]"),
    ]
    for args, code, message in cases:
        log = TAOBAO if "--dataset=taobao" in args else path
        result = prepare_cli(*args, f"--input={log}", f"--output_dir={tmp_path / 'o'}")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == code, (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and lines[-1].startswith("error: ") and message in lines[-1], lines
    assert not os.path.exists(tmp_path / "o")


def test_zero_negatives_gives_positives_only(tmp_path):
    fmt_log = _csv(tmp_path, "log.csv", "".join(f"{u},{i},{i % 3},pv,{1511500000 + i}\n" for u in (1, 2)
                                                  for i in range(10 * u, 10 * u + 30)))
    spec = prepare("taobao", fmt_log, str(tmp_path / "out"), Protocol(min_clicks=20, train_targets=2, negatives=0))
    assert spec.counts == {"train": 4, "val": 2, "test": 2}
    # a ranker cannot learn from clicks alone: the trainer refuses, not a run that ends with AUC NaN
    from dare_tf.training import TrainConfig, train

    with pytest.raises(ValueError, match="out was prepared with --negatives=0 from a click log: every example is "
                                         "a click, so a ranker has nothing to tell apart"):
        train(str(tmp_path / "out"), str(tmp_path / "run"), TrainConfig.create(preset="dare"))
    assert not (tmp_path / "run").exists()
    assert (InMemorySplit.load(str(tmp_path / "out"), "train").columns["label"] == 1).all()


@pytest.mark.slow
def test_a_model_trains_and_evaluates_on_an_impression_log(tmp_path):
    """End to end: a TSV impression log prepared, trained on (streamed and cached), evaluated."""
    from dare_tf.training import TrainConfig, train

    fmt, path, protocol = impression_log(tmp_path, "tsv")
    out = str(tmp_path / "imp")
    spec = prepare(fmt, path, out, protocol)
    for in_memory_mb in (0, 4096):
        results = train(out, str(tmp_path / f"run{in_memory_mb}"), TrainConfig.create(
            preset="dare", batch_size=64, eval_batch_size=64, epochs=2, eval_every=10, jit_compile=False,
            verbose=0, in_memory_mb=in_memory_mb, model_overrides=dict(top_k=5, max_len=20)))
        assert results["per_seed"][0]["steps"] == (2 * spec.counts["train"] // 64 if in_memory_mb
                                                    else 2 * -(-spec.counts["train"] // 64))
        assert 0.0 <= results["test"]["auc"] <= 1.0 and np.isfinite(results["test"]["logloss"])


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_a_column(tmp_path):
    """Issue 45 (10): a UTF-8 BOM before the header (as spreadsheets save CSV) gave
    `has no column 'user_id'` with the BOM invisible. The mark is not read as part
    of the first column, with a header or without; the rows are the same."""
    from dare_tf.data.logs.reader import read_clicks

    columns = (("user", "user_id"), ("item", "item"), ("category", "cat"), ("time", "ts"))
    named = LogFormat(name="csv", file_format="csv", header=True, columns=columns)
    plain = _csv(tmp_path, "plain.csv", "user_id,item,cat,ts\n" + "".join(
        f"{u},{i},{i % 4},{100 + i}\n" for u in (1, 2, 3) for i in range(10)))
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + open(plain, "rb").read())
    a, b = read_clicks(plain, named), read_clicks(str(marked), named)
    for column in ("user", "item", "category", "time"):
        np.testing.assert_array_equal(getattr(a, column), getattr(b, column))
    headless = LogFormat(name="csv", file_format="csv", columns=(("user", "0"), ("item", "1"), ("category", "2"),
                                                                    ("time", "3")))
    bare = tmp_path / "bare.csv"
    bare.write_bytes(b"\xef\xbb\xbf" + b"".join(open(plain, "rb").readlines()[1:]))
    np.testing.assert_array_equal(read_clicks(str(bare), headless).user, a.user)


def test_a_quoted_field_with_a_line_break_is_named_as_such(tmp_path):
    """Issue 45 (11): a quoted field holding a line break was reported as its second
    half's field count (or, skipped, its first half read as a row). The line where
    the quote opens is named; with --skip_bad_lines both halves are skipped."""
    from dare_tf.data.logs.reader import read_clicks

    path = _csv(tmp_path, "quoted.csv", 'user,item,ts,note\n1,2,100,"ok"\n1,3,101,"line one\nline two"\n2,4,102,x\n')
    fmt = LogFormat(name="csv", file_format="csv", header=True, columns=(("user", "user"), ("item", "item"),
                                                                         ("time", "ts")))
    with pytest.raises(BadLineError, match=re.escape(
            f"{path}:3: a quoted field that does not end on its line (a line break inside quotes: one row is one line "
            "here; remove the line breaks from quoted fields): '1,3,101,\"line one' (use --skip_bad_lines to skip and "
            "count such lines)")):
        read_clicks(path, fmt)
    skipped = read_clicks(path, fmt, skip_bad_lines=True)
    assert skipped.item.tolist() == [2, 4] and skipped.bad_lines == 2


def _store_and_examples(directory):
    from dare_tf.data.storage.store import load_store

    spec = DatasetSpec.load(directory)
    store = load_store(directory, spec)
    return spec, {"items": store.items, "categories": store.categories, "length": store.length,
                  **{split: columns_of(directory, split) for split in ("train", "val", "test")}}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _same(a[k], b[k])
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_calendar_times_prepare_as_their_unix_seconds(tmp_path):
    """Issue 47: the Taobao sample with its times written as ISO 8601 (zoned, naive,
    with an offset, a fraction of a second: mixed in one file), as a --time_format,
    and as Parquet timestamps and text prepares as the integer log does; a time
    that does not parse names its line and the forms expected."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [line.rstrip("\n").split(",") for line in open(TAOBAO)]
    moments = [datetime.datetime.fromtimestamp(int(r[4]), datetime.timezone.utc) for r in rows]
    forms = [lambda m: m.strftime("%Y-%m-%dT%H:%M:%SZ"), lambda m: m.strftime("%Y-%m-%d %H:%M:%S"),
             lambda m: m.astimezone(datetime.timezone(datetime.timedelta(hours=8))).isoformat(),
             lambda m: m.strftime("%Y-%m-%dT%H:%M:%S.250")]
    iso = tmp_path / "iso.csv"
    iso.write_text("".join(",".join(r[:4] + [forms[i % 4](m)]) + "\n" for i, (r, m) in enumerate(zip(rows, moments))))
    custom = tmp_path / "custom.csv"
    custom.write_text("".join(",".join(r[:4] + [m.strftime("%d/%m/%Y %H:%M:%S")]) + "\n"
                              for r, m in zip(rows, moments)))
    columns = "user=0,item=1,category=2,action=3,time=4"
    table = pa.table({"user": [int(r[0]) for r in rows], "item": [int(r[1]) for r in rows],
                      "category": [int(r[2]) for r in rows], "action": [r[3] for r in rows],
                      "stamp": pa.array([int(r[4]) * 1000 for r in rows], pa.timestamp("ms", "UTC")),
                      "text": [forms[0](m) for m in moments]})
    pq.write_table(table, tmp_path / "log.parquet", row_group_size=len(rows) // 3)
    runs = {"int": [f"--input={TAOBAO}", f"--columns={columns}"],
            "iso": [f"--input={iso}", f"--columns={columns}"],
            "custom": [f"--input={custom}", f"--columns={columns}", "--time_format=%d/%m/%Y %H:%M:%S"],
            "stamp": ["--format=parquet", f"--input={tmp_path / 'log.parquet'}",
                      "--columns=user=user,item=item,category=category,action=action,time=stamp"],
            "text": ["--format=parquet", f"--input={tmp_path / 'log.parquet'}",
                     "--columns=user=user,item=item,category=category,action=action,time=text"]}
    prepared = {}
    for name, args in runs.items():
        args = args if "--format=parquet" in args else ["--format=csv", *args]
        done = prepare_cli(*args, "--click=pv", f"--output_dir={tmp_path / name}", "--seed=1", "--split=time")
        assert done.returncode == 0, (name, done.stderr[-2000:])
        prepared[name] = _store_and_examples(str(tmp_path / name))
    spec, expected = prepared.pop("int")
    assert "time_format" not in spec.source["log"]  # (an integer log's spec.json is as before)
    for name, (other, got) in prepared.items():
        _same(expected, got)
        assert other.protocol["windows"] == spec.protocol["windows"], name
    assert prepared["custom"][0].source["log"]["time_format"] == "%d/%m/%Y %H:%M:%S"
    recorded = LogFormat.from_json(prepared["custom"][0].source["log"])  # (what --append reads the next day as)
    assert recorded.time_format == "%d/%m/%Y %H:%M:%S" and recorded.to_json() == prepared["custom"][0].source["log"]
    # A time that does not parse: its line and what was expected.
    lines = iso.read_text().splitlines()
    lines[6] = lines[6].rsplit(",", 1)[0] + ",2017-11-31T08:00:00Z"
    iso.write_text("\n".join(lines) + "\n")
    done = prepare_cli("--format=csv", f"--input={iso}", f"--columns={columns}", "--click=pv",
                       f"--output_dir={tmp_path / 'bad'}")
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        f"error: {iso}:7: time (column '4'): '2017-11-31T08:00:00Z' is not a time: expected Unix seconds (an integer) "
        "or an ISO 8601 time such as 2026-11-01T00:31:27Z (or name its format: --time_format=...): "
        f"{lines[6]!r} (use --skip_bad_lines to skip and count such lines)"), done.stderr[-2000:]


@pytest.mark.parametrize("runner", ["in_memory", "beam"])
def test_a_time_past_int64_is_refused_in_one_line(tmp_path, runner):
    """Issue 59 (2): a time column mixing ISO 8601 and integers (read value by value) ended in
    `OverflowError: Python int too large to convert to C long` at a time past int64; it is refused
    like an id, naming the line."""
    log = tmp_path / "log.csv"
    log.write_text("u1,i1,c1,pv,2017-11-25T00:00:00Z\nu1,i2,c1,pv,99999999999999999999\n")
    result = run_program("data.prepare", "--format=csv", "--string_ids",
                         "--columns=user=0,item=1,category=2,action=3,time=4", "--click=pv", f"--input={log}",
                         f"--output_dir={tmp_path / 'out'}", f"--runner={runner}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {log}:2: time (column '4') = 99999999999999999999 does not fit a 64-bit integer: "
        "'u1,i2,c1,pv,99999999999999999999' (use --skip_bad_lines to skip and count such lines)"
        + (" [while running 'Parse']" if runner == "beam" else "")]


def test_beam_buckets_past_the_logs_size_are_capped_saying_so(tmp_path, caplog):
    """Issue 59 (4): a bucket count far past the log's size is cut to one bucket per 16 KiB of log,
    in one warning line; the records are those of the in-memory driver."""
    from dare_tf.data.preparation.beam import prepare as prepare_beam
    from tests.data.preparation.test_prepare import assert_same_datasets

    log = _csv(tmp_path, "log.csv", "".join(f"{u},{i},{i % 3},pv,{1511500000 + i}\n" for u in range(1, 9)
                                            for i in range(10 * u, 10 * u + 40)))
    size = os.path.getsize(log)
    protocol = Protocol(min_clicks=20, train_targets=2)
    with caplog.at_level("WARNING"):
        prepare_beam("taobao", log, str(tmp_path / "beam"), protocol, buckets=1000)
    assert f"--beam_buckets=1000: capped at 1, one bucket per 16 KiB of the log ({log}: {size} bytes)" in caplog.text
    prepare("taobao", log, str(tmp_path / "memory"), protocol)
    assert_same_datasets(str(tmp_path / "beam"), str(tmp_path / "memory"))
    with pytest.raises(ValueError, match="^buckets=1025: expected 1 to 1024$"):
        prepare_beam("taobao", log, str(tmp_path / "no"), protocol, buckets=1025)


@pytest.mark.parametrize("runner", ["in_memory", "beam"])
def test_skipping_never_hides_a_disaster(tmp_path, runner):
    """First-day issue (3): `--skip_bad_lines` on a log whose every line failed on one column exited 0
    after skipping 44,307 of 48,802 lines. More than `--max_bad_share` (default 1%) of the lines is
    refused with the count, the share and the most common problem; a few are skipped with a warning
    that names them; an error that every line shares names the column's fix, not --skip_bad_lines."""
    good = "".join(f"{u},{i},{i % 3},pv,{1511500000 + i}\n" for u in (1, 2, 3) for i in range(10 * u, 10 * u + 40))
    bad = "".join(f"u{u},{i},{i % 3},pv,{1511500000 + i}\n" for u in (7, 8) for i in range(40))
    columns = "--columns=user=0,item=1,category=2,action=3,time=4"

    def run(log, *args):
        return run_program("data.prepare", "--format=csv", columns, "--click=pv", f"--input={log}",
                           f"--output_dir={tmp_path / 'out'}", "--min_clicks=20", "--train_targets=2",
                           f"--runner={runner}", *args)

    mostly_bad = _csv(tmp_path, "bad.csv", good[:good.index("\n") + 1] + bad)
    refused = run(mostly_bad, "--skip_bad_lines")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"error: {mostly_bad}: --skip_bad_lines skipped 80 of 81 lines (98.8%), more than --max_bad_share=0.01; the "
        f"most common problem (80 lines) is {mostly_bad}:2: user (column '0') is not an integer (string ids: "
        "--string_ids): 'u7': fix that column (--columns, --string_ids, --time_format) rather than skip it"]
    stopped = run(mostly_bad)
    assert stopped.returncode == 1 and stopped.stderr.strip().splitlines() == [
        f"error: {mostly_bad}:2: user (column '0') is not an integer (string ids: --string_ids): 'u7': "
        "'u7,0,0,pv,1511500000' (so are 79 of the next 79 lines: the column is read wrong, not a few lines bad; fix "
        "--columns, --string_ids or --time_format)" + (" [while running 'Parse']" if runner == "beam" else "")]
    assert not os.path.exists(tmp_path / "out")
    one_bad = _csv(tmp_path, "one.csv", good + "x,1,1,pv,1511500000\n")
    assert run(one_bad, "--skip_bad_lines", "--max_bad_share=0.001").stderr.strip().splitlines()[-1].startswith(
        f"error: {one_bad}: --skip_bad_lines skipped 1 of 121 lines (0.8%), more than --max_bad_share=0.001;")
    done = run(one_bad, "--skip_bad_lines")
    assert done.returncode == 0, done.stderr
    assert (f"{one_bad}: skipped 1 bad line(s) (0.83%; the most common: 1 lines, {one_bad}:121: user (column '0') "
            "is not an integer (string ids: --string_ids): 'x')") in done.stderr
    assert DatasetSpec.load(str(tmp_path / "out")).source["bad_lines"] == 1
    assert run(one_bad, "--max_bad_share=0.5").stderr.strip().splitlines() == [
        "error: --max_bad_share is for --skip_bad_lines (see --help)"]


def test_a_bad_share_bound_that_is_not_a_share_is_refused():
    """Issue 68 (11): nan (and anything outside 0..1) switched the bound off in the library too."""
    from dare_tf.data.logs.reader import check_bad_share

    for bound in (float("nan"), -0.1, 1.5):
        with pytest.raises(ValueError, match=f"^max_bad_share={bound}: must be a number from 0 to 1$"):
            check_bad_share("log.csv", 10_000, 8_999, {"x": (8_999, "log.csv:2: ...")}, bound)


def test_a_millisecond_log_is_refused_with_the_flag_that_reads_it_and_a_zone_is_the_logs(tmp_path):
    """Issue 69 (2), the repro: a Parquet `ts` column of epoch milliseconds prepared silently (its
    times in the year ~58,000); calendar times without a zone could only be read as UTC."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.store import SequenceStore

    users, per_user = 12, 40
    rng = np.random.default_rng(1)
    seconds = 1_772_000_000 + np.tile(np.arange(per_user) * 60, users)
    table = pa.table({"user": np.repeat(np.arange(users) + 7, per_user), "item": rng.integers(1, 150, users * per_user),
                      "ts": seconds * 1000})
    log = str(tmp_path / "ms.parquet")
    pq.write_table(table, log)
    common = ["--format=parquet", "--columns=user=user,item=item,time=ts", f"--input={log}", "--min_clicks=20",
              "--train_targets=2"]
    refused = prepare_cli(*common, f"--output_dir={tmp_path / 'refused'}")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: {log}: time (column 'ts'): 1772002340000 read as seconds is past the year 2200; as milliseconds it "
        "is 2026-02-25 06:52:20 UTC (1772002340): give --time_unit=ms"), refused.stderr
    done = prepare_cli(*common, "--time_unit=ms", f"--output_dir={tmp_path / 'ms'}")
    assert done.returncode == 0, done.stderr
    spec = DatasetSpec.load(str(tmp_path / "ms"))
    kept = SequenceStore.load(str(tmp_path / "ms"), spec, click_times=True).click_times
    assert kept.min() == seconds.min() and kept.max() == seconds.max()
    # Local calendar times (Paris, winter: UTC+1) read in their zone.
    csv = tmp_path / "local.csv"
    csv.write_text("".join(f"{u},{i},2026-11-01 09:{m:02d}:00\n" for u in range(7, 12) for m, i in
                           enumerate(rng.integers(1, 50, 30))))
    local = ["--format=csv", "--columns=user=0,item=1,time=2", f"--input={csv}", "--min_clicks=20",
             "--train_targets=2"]
    assert prepare_cli(*local, f"--output_dir={tmp_path / 'utc'}").returncode == 0
    assert prepare_cli(*local, "--time_zone=Europe/Paris", f"--output_dir={tmp_path / 'paris'}").returncode == 0
    times = {z: SequenceStore.load(str(tmp_path / z), DatasetSpec.load(str(tmp_path / z)), click_times=True)
             .click_times for z in ("utc", "paris")}
    assert (times["utc"] - times["paris"] == 3600).all() and times["utc"].min() == 1_793_523_600
    for args, message in ((["--time_zone=Mars/Olympus"], "error: --time_zone=Mars/Olympus: not a time zone (an "
                                                          "IANA name such as Europe/Paris or America/New_York) (see "
                                                          "--help)"),
                          (["--time_unit=ms", "--time_format=%Y-%m-%d %H:%M:%S"],
                           "error: --time_unit=ms scales integer times; --time_format reads calendar times: give one "
                           "of them (see --help)")):
        bad = prepare_cli(*local, *args, f"--output_dir={tmp_path / 'bad'}")
        assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == message, bad.stderr  # (usage)


def test_a_custom_logs_carts_and_buys_are_behaviours_with_their_action_as_a_field(tmp_path):
    """Issue 69 (3): `--click=view` dropped a shop's cart and buy rows without a count, and
    `--action_field` took a preset's actions only; `--actions` names a custom log's, every row
    enters the history with its kind as the field `action`, and data.prepare counts them."""
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.store import SequenceStore

    rng = np.random.default_rng(0)
    kinds = rng.choice(["view", "cart", "buy"], 40 * 60, p=[0.8, 0.15, 0.05])
    kinds[:3] = ["buy", "view", "cart"]  # (a buy first: the field's dense ids follow first appearance, not --actions)
    times = 1_700_000_000 + np.cumsum(rng.integers(30, 600, 40 * 60))
    log = tmp_path / "shop.csv"
    log.write_text("".join(f"{u // 60 + 1},{rng.integers(1, 200)},{rng.integers(1, 12)},{k},{t}\n"
                           for u, (k, t) in enumerate(zip(kinds, times))))
    out = str(tmp_path / "shop")
    args = ["--format=csv", "--columns=user=0,item=1,category=2,action=3,time=4", "--click=view", f"--input={log}",
            "--min_clicks=20", "--train_targets=2"]
    done = prepare_cli(*args, "--actions=view,cart,buy", "--action_field", f"--output_dir={out}")
    assert done.returncode == 0, done.stderr
    spec = DatasetSpec.load(out)
    codes = SequenceStore.load(out, spec).fields["action"]
    raw = (tmp_path / "shop" / "action_ids.txt").read_text().split()  # (dense id k's raw code: its --actions place)
    assert raw == ["3", "1", "2"]
    counts = {name: int((codes == raw.index(str(i + 1)) + 1).sum()) for i, name in enumerate(("view", "cart", "buy"))}
    assert counts == {name: int((kinds == name).sum()) for name in counts}  # every row of every kind, once
    assert done.stdout.strip().splitlines()[-1] == (
        f"the histories' clicks by action: view {counts['view']} (the clicks: examples and history), cart "
        f"{counts['cart']} (history), buy {counts['buy']} (history)")
    assert [f["name"] for f in spec.fields] == ["action"]
    # One line each: an action the log has but --actions does not name; --action_field without --actions.
    refused = prepare_cli(*args, "--actions=view,cart", "--action_field", f"--output_dir={tmp_path / 'x'}")
    assert refused.returncode == 1 and "action (column '3')" in refused.stderr.strip().splitlines()[-1], refused.stderr
    for extra, message in ((["--action_field"], "error: --action_field keeps every action as a field: it needs an "
                                                "action column and its values: --actions=VALUE,... for a custom log "
                                                "(a preset's are known) (see --help)"),
                           (["--actions=cart,buy"], "error: --actions=cart,buy: every action value once, --click=view "
                                                    "among them (see --help)")):
        bad = prepare_cli(*args, *extra, f"--output_dir={tmp_path / 'y'}")
        assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == message, bad.stderr
