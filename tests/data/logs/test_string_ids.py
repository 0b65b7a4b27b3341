"""dare_tf.data.logs.string_ids (`data.prepare --string_ids`): a log of string ids and ISO
times prepares, per user and by time with a day appended, exactly the records its
integer twin prepares, its id maps holding the strings; CSV and Parquet alike; bad
ids are named by line."""

import csv
import datetime
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dare_tf.data.logs.string_ids import OWN_PREFIX

from dare_tf.data.preparation.append import append
from dare_tf.data.storage.fields import FieldSchema
from dare_tf.data.logs.formats import BadLineError, LogFormat, LogFormatError
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import ID_MAP_FILES, DatasetSpec
from tests.data.preparation.test_append import DAY, assert_same_data
from tests.data.preparation.test_prepare import TAOBAO

COLUMNS = (("user", "uid"), ("item", "product"), ("category", "cat"), ("action", "action"), ("time", "ts"),
           ("field:brand", "brand"))
INTS = LogFormat(name="csv", file_format="csv", columns=COLUMNS, header=True, click="pv")
STRINGS = LogFormat(name="csv", file_format="csv", columns=COLUMNS, header=True, click="pv", string_ids=True)
PER_USER = Protocol(min_clicks=20, max_len=20, train_targets=2, stride=2)


def user_id(u):
    return f"u-{int(u):x}"


def sku(i):
    return f"SKU{int(i):09d}"


def category_id(c):
    return f"c_{c}"


def brand(i):  # (every seventh item has none: an empty cell, the item's own value)
    return "" if int(i) % 7 == 0 else str(int(i) % 50)


def iso(t):
    return datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_twins(root, rows, name):
    """The rows as an integer log (Unix times) and as its string twin (ISO times)."""
    ints, strings = os.path.join(root, f"{name}_ints.csv"), os.path.join(root, f"{name}_strings.csv")
    header = [c for _, c in COLUMNS]
    with open(ints, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([[u, i, c, a, t, brand(i)] for u, i, c, a, t in rows])
    with open(strings, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([[user_id(u), sku(i), category_id(c), a, iso(t), brand(i) and f"B{brand(i)}"]
                     for u, i, c, a, t in rows])
    return ints, strings


def renamed(data_dir, name, rename):
    with open(os.path.join(data_dir, name)) as f:
        return [rename(line) for line in f.read().splitlines()]


def assert_twins(ints_dir, strings_dir):
    """The same records; each id map line the string of the integer twin's."""
    spec_i, spec_s = DatasetSpec.load(ints_dir), DatasetSpec.load(strings_dir)
    assert spec_s.string_ids and not spec_i.string_ids and "string_ids" not in spec_i.source["log"]
    for name in sorted(os.listdir(ints_dir)):
        if name.endswith(".tfrecord.gz"):
            with open(os.path.join(ints_dir, name), "rb") as a, open(os.path.join(strings_dir, name), "rb") as b:
                assert a.read() == b.read(), name
    for kind, rename in (("user", user_id), ("item", sku), ("category", category_id)):
        got = open(os.path.join(strings_dir, ID_MAP_FILES[kind])).read().splitlines()
        assert got == renamed(ints_dir, ID_MAP_FILES[kind], rename), kind

    def brand_id(line):  # an integer dataset's own value is -1 - item; a string one's OWN_PREFIX + ITEM
        return f"B{line}" if int(line) >= 0 else OWN_PREFIX + sku(-1 - int(line))

    ids, of_item = FieldSchema.of([f for f in spec_i.fields if f["name"] == "brand"]).files()
    assert open(os.path.join(strings_dir, ids)).read().splitlines() == renamed(ints_dir, ids, brand_id)
    assert open(os.path.join(strings_dir, of_item)).read() == open(os.path.join(ints_dir, of_item)).read()


@pytest.fixture(scope="module")
def rows():
    with open(TAOBAO) as f:
        return [r for r in csv.reader(f)][:30000]


def test_string_ids_and_iso_times_prepare_the_records_of_their_integer_twin(rows, tmp_path):
    ints, strings = write_twins(tmp_path, rows, "log")
    prepare(INTS, ints, str(tmp_path / "ints"), PER_USER)
    spec = prepare(STRINGS, strings, str(tmp_path / "strings"), PER_USER)
    assert spec.counts["train"] > 1000
    assert_twins(str(tmp_path / "ints"), str(tmp_path / "strings"))
    # Parquet string columns (and timestamps) read as the CSV's strings
    table = pacsv.read_csv(strings, convert_options=pacsv.ConvertOptions(
        column_types={c: pa.string() for _, c in COLUMNS}))
    table = table.set_column(4, "ts", pc.cast(pc.strptime(table["ts"], "%Y-%m-%dT%H:%M:%SZ", "s"),
                                              pa.timestamp("s", tz="UTC")))
    pq.write_table(table, tmp_path / "log.parquet", row_group_size=7000)
    parquet = LogFormat(name="parquet", file_format="parquet", columns=COLUMNS, click="pv", string_ids=True)
    prepare(parquet, str(tmp_path / "log.parquet"), str(tmp_path / "parquet"), PER_USER)
    assert_twins(str(tmp_path / "ints"), str(tmp_path / "parquet"))


def test_a_day_of_string_ids_appends_what_its_integer_twin_appends(rows, tmp_path):
    days = sorted({int(r[4]) // DAY for r in rows})
    time_split = Protocol(split="time", min_clicks=20, max_len=20, partitions=3, train_targets=2, stride=2, seed=4)
    before = [r for r in rows if int(r[4]) // DAY < days[-2]]
    after = [r for r in rows if int(r[4]) // DAY >= days[-2]]
    for name, part in (("base", before), ("day", after)):
        write_twins(tmp_path, part, name)
    for kind, fmt in (("ints", INTS), ("strings", STRINGS)):
        prepare(fmt, str(tmp_path / f"base_{kind}.csv"), str(tmp_path / kind), time_split)
        append(str(tmp_path / f"day_{kind}.csv"), str(tmp_path / kind), fmt)
    spec = DatasetSpec.load(str(tmp_path / "strings"))
    assert len(spec.source["appended"]) == 1 and spec.counts["test"] > 0
    assert_twins(str(tmp_path / "ints"), str(tmp_path / "strings"))
    # and appended day by day = prepared at once
    write_twins(tmp_path, rows, "whole")
    prepare(STRINGS, str(tmp_path / "whole_strings.csv"), str(tmp_path / "whole"), time_split)
    assert_same_data(str(tmp_path / "whole"), str(tmp_path / "strings"))


@pytest.mark.parametrize("line, message", [
    ("u-1,SKU\t1,c_1,pv,2017-11-25T00:00:00Z,", "item (column 'product') holds a control character (a string id "
                                                "is any text without tabs, line breaks or other control characters)"),
    ("u-1,,c_1,pv,2017-11-25T00:00:00Z,", "item (column 'product') is empty"),
    ("u-1,SKU1,c_1,pv,25/11/2017,", "time (column 'ts'): '25/11/2017' is not a time: expected Unix seconds (an "
                                    "integer) or an ISO 8601 time such as 2026-11-01T00:31:27Z (or name its format: "
                                    "--time_format=...)"),
    ("u-1,SKU1,c_1,pv,2017-11-25T00:00:00Z,B\x7f2", "field:brand (column 'brand') holds a control character (a "
                                                     "string id is any text without tabs, line breaks or other "
                                                     "control characters)"),
    # Issue 68 (9): C1 controls (NEL is a line break for str.splitlines) and U+2028/U+2029
    *[(f"u-1,iSEP{c}X,c_1,pv,2017-11-25T00:00:00Z,", "item (column 'product') holds a control character (a string "
       "id is any text without tabs, line breaks or other control characters)") for c in "\x85\x9b\u2028\u2029"],
])
def test_a_bad_string_id_is_named_by_line(tmp_path, line, message):
    path = tmp_path / "log.csv"
    good = "u-1,SKU1,c_1,pv,2017-11-25T00:00:00Z,B1\n"
    path.write_text("uid,product,cat,action,ts,brand\n" + good * 3 + line + "\n")
    with pytest.raises(BadLineError) as e:
        prepare(STRINGS, str(path), str(tmp_path / "out"), PER_USER)
    assert str(e.value) == f"{path}:5: {message}: {line!r} (use --skip_bad_lines to skip and count such lines)"


@pytest.mark.parametrize("parquet", [False, True])
def test_an_id_past_the_longest_is_a_bad_line_naming_its_length_and_the_longest_prepares(tmp_path, parquet):
    """Issue 68 (4): one maximum id length (MAX_ID_CHARS) in every reader, csv (a field past the
    csv module's 131,072 characters included) and Parquet alike; the message shows the line cut."""
    from dare_tf.data.logs.string_ids import MAX_ID_CHARS

    good = [[f"u-{u}", f"SKU{i + u}", "c_1", "pv", f"2017-11-25T00:00:{i:02d}Z", "B1"]
            for u in (1, 2) for i in range(24)]
    longest = good + [["u-1", "I" * MAX_ID_CHARS, "c_1", "pv", "2017-11-25T00:00:00Z", "B1"]]
    names = ["uid", "product", "cat", "action", "ts", "brand"]
    for rows, length in ((longest, None), (good + [["u-1", "I" * 200_000, "c_1", "pv", "2017-11-25T00:00:00Z", "B1"]],
                                           200_000)):
        path = tmp_path / ("log.parquet" if parquet else "log.csv")
        if parquet:
            pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}), path)
        else:
            path.write_text(",".join(names) + "\n" + "".join(",".join(r) + "\n" for r in rows))
        fmt = LogFormat(name="parquet", file_format="parquet", columns=COLUMNS, header=False, click="pv",
                        string_ids=True) if parquet else STRINGS
        out = tmp_path / f"out{length}"
        if length is None:
            prepare(fmt, str(path), str(out), PER_USER)
            assert "I" * MAX_ID_CHARS in open(out / "item_ids.txt").read().splitlines()
            continue
        with pytest.raises(BadLineError) as e:
            prepare(fmt, str(path), str(out), PER_USER)
        message = str(e.value)
        assert message.startswith(f"{path}:") and (": item (column 'product') is longer than the 4,096 characters a "
                                                   "string id may hold (200,000)") in message, message[:500]
        assert parquet or message.startswith(f"{path}:50: ")
        assert len(message) < 1000


SHOP = ["u1", "cust-ed2192", "Ärger & Co"]
SHOP_ITEMS = ["SKU 1", "Nordic Living Lamp", "\"Quoted\" Mug", "Cup, large", "Café crème", "~SKU 1", "  padded  "]
SHOP_CATEGORIES = ["Pet Supplies", "Home & Garden", "Küche"]


@pytest.mark.parametrize("runner", ["in_memory", "beam"])
def test_a_shops_ids_are_taken_as_they_come(tmp_path, runner):
    """First-day issue (2): a shop's category names (`Pet Supplies`, `Home & Garden`), SKUs with
    spaces, quotes, commas in quoted cells and non-ASCII letters are string ids as written, through
    both drivers, and the id maps hold each distinct cell once; a brand typed `~SKU 1` and the item
    `SKU 1`'s own brand (an empty cell) stay two values (they were one, `~SKU 1`)."""
    from dare_tf.data.preparation import beam
    from dare_tf.data.storage.id_maps import read_id_map

    lines, k, items = [], 0, set()
    for u, user in enumerate(SHOP):
        for j in range(30):
            item = SHOP_ITEMS[(u + j) % len(SHOP_ITEMS)] if j < 10 else f"Plain item {u}-{j}"
            items.add(item)
            brand = "" if item == "SKU 1" else ("~SKU 1" if j % 3 == 0 else "Acme Co.")
            cells = [user, item, SHOP_CATEGORIES[j % 3], "pv", f"2017-11-25T00:{k // 60 % 60:02d}:{k % 60:02d}+01:00",
                     brand]
            lines.append(",".join(f'"{c.replace(chr(34), chr(34) * 2)}"' if ("," in c or '"' in c) else c
                                  for c in cells))
            k += 1
    path = tmp_path / "shop.csv"
    path.write_text("uid,product,cat,action,ts,brand\n" + "\n".join(lines) + "\n", encoding="utf-8")
    out = str(tmp_path / "out")
    protocol = Protocol(min_clicks=20, train_targets=2, negatives=1)
    if runner == "beam":
        beam.prepare(STRINGS, str(path), out, protocol, buckets=2)
    else:
        prepare(STRINGS, str(path), out, protocol)
    assert sorted(read_id_map(out, "user")) == sorted(SHOP)
    assert sorted(read_id_map(out, "item")) == sorted(items)
    assert sorted(read_id_map(out, "category")) == sorted(SHOP_CATEGORIES)
    brands = open(os.path.join(out, "brand_ids.txt"), encoding="utf-8").read().splitlines()
    assert sorted(brands) == sorted(["Acme Co.", "~SKU 1", OWN_PREFIX + "SKU 1"])


@pytest.mark.slow
def test_the_beam_driver_prepares_string_ids_as_the_in_memory_one(rows, tmp_path):
    """Blocks parsed apart number their strings apart: the Beam driver groups them by
    fingerprint and writes the same records and id maps (several blocks)."""
    from dare_tf.data.preparation import beam
    from tests.data.preparation.test_prepare import assert_same_datasets

    _, strings = write_twins(tmp_path, rows[:12000], "log")
    time_split = Protocol(split="time", min_clicks=20, max_len=20, partitions=3, train_targets=2, stride=2)
    for name, protocol in (("user", PER_USER), ("time", time_split)):
        prepare(STRINGS, strings, str(tmp_path / f"{name}-memory"), protocol)
        beam.prepare(STRINGS, strings, str(tmp_path / f"{name}-beam"), protocol, block_bytes=64 << 10, buckets=3)
        assert_same_datasets(str(tmp_path / f"{name}-memory"), str(tmp_path / f"{name}-beam"))
        assert (open(tmp_path / f"{name}-beam" / "brand_ids.txt").read()
                == open(tmp_path / f"{name}-memory" / "brand_ids.txt").read())


def test_string_ids_are_text_and_parquet_columns_must_be_strings(tmp_path):
    from dare_tf.data.logs.reader import read_clicks

    path = tmp_path / "log.csv"
    path.write_text("uid,product,cat,action,ts,brand\n" + "".join(
        f"u{u},{item},c,pv,{1_511_000_000 + k},\n" for k, (u, item) in enumerate([(1, "007"), (1, "7"), (2, "07")])))
    clicks = read_clicks(str(path), STRINGS)
    assert clicks.raw("item", clicks.item).tolist() == ["007", "7", "07"]  # three ids, not one
    assert clicks.raw("brand", clicks.fields["brand"]).tolist() == [OWN_PREFIX + i for i in ("007", "7", "07")]
    with pytest.raises(BadLineError, match=r"item \(column 'product'\) is not an integer \(string ids: --string_ids\): "
                                           "'SKU1'"):
        (tmp_path / "ints.csv").write_text("uid,product,cat,action,ts,brand\n1,SKU1,1,pv,1511000000,\n")
        read_clicks(str(tmp_path / "ints.csv"), INTS)
    pq.write_table(pa.table({"uid": [1], "product": [7], "cat": ["c"], "action": ["pv"], "ts": [1],
                             "brand": ["b"]}), tmp_path / "ints.parquet")
    parquet = LogFormat(name="parquet", file_format="parquet", columns=COLUMNS, click="pv", string_ids=True)
    with pytest.raises(LogFormatError, match=r"column 'uid' \(user\) has type int64; --string_ids reads ids from a "
                                             "string column$"):
        read_clicks(str(tmp_path / "ints.parquet"), parquet)


def test_the_generator_writes_a_string_id_log_that_prepares_as_its_integer_log(tmp_path):
    from dare_tf.data.generation.synthetic import SyntheticConfig, write

    config = SyntheticConfig(users=60, items=300, categories=12, min_length=30, max_length=60, length_median=45,
                             brands=20, seed=5)
    write(config, str(tmp_path / "ints.csv"))
    truth = write(config, str(tmp_path / "strings.csv"), string_ids=True)
    first = open(tmp_path / "strings.csv").readline().strip().split(",")
    assert first[0] == "U000001" and first[1].startswith("SKU") and first[2].startswith("C") and \
        first[4].endswith("Z") and first[5].startswith("B") and "related_category" not in truth
    columns = (("user", "0"), ("item", "1"), ("category", "2"), ("action", "3"), ("time", "4"), ("field:brand", "5"))
    protocol = Protocol(min_clicks=20, max_len=20, train_targets=2, stride=2)
    for name, strings in (("ints", False), ("strings", True)):
        prepare(LogFormat(name="csv", file_format="csv", columns=columns, click="pv", string_ids=strings),
                str(tmp_path / f"{name}.csv"), str(tmp_path / name), protocol)
    for shard in sorted(os.listdir(tmp_path / "ints")):
        if shard.endswith(".tfrecord.gz"):
            assert (tmp_path / "ints" / shard).read_bytes() == (tmp_path / "strings" / shard).read_bytes(), shard
    assert [f"SKU{int(i):07d}" for i in open(tmp_path / "ints" / "item_ids.txt").read().split()] == \
        open(tmp_path / "strings" / "item_ids.txt").read().split()
