"""`python -m serving.histories`: load a prepared dataset's store, append live
clicks from a file and from standard input, show a user's history."""

import json
import os

import numpy as np

from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.data.storage.store import SequenceStore
from tests.programs import run_program

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def histories(*args, stdin=None):
    return run_program("serving.histories", *args, input=stdin)


def test_load_append_show(taobao, tmp_path):
    store = f"lmdb:{tmp_path / 'histories'}"
    loaded = histories("load", f"--data_dir={taobao}", f"--store={store}")
    assert loaded.returncode == 0, loaded.stderr
    spec = DatasetSpec.load(taobao)
    sequences = SequenceStore.load(taobao, spec, click_times=True)
    users = np.flatnonzero(sequences.length)
    assert loaded.stdout.strip().endswith(f"loaded {len(users)} users from {taobao}: kept {len(sequences.items)} of "
                                          f"{len(sequences.items)} clicks (the last 10000 per user: --max_clicks)")
    # Issue 45 (6): loaded again (a kill whose outcome is unknown): nothing added (it doubled short histories).
    again = histories("load", f"--data_dir={taobao}", f"--store={store}")
    assert again.returncode == 0 and again.stdout.strip() == (f"{store}: holds {taobao} already (loaded before); "
                                                              "nothing loaded"), again
    dense = int(users[3])
    raw_user = int(read_id_map(taobao, "user")[dense - 1])
    raw_items = np.array([0] + [int(r) for r in read_id_map(taobao, "item")])
    start, length = sequences.start[dense], sequences.length[dense]
    shown = json.loads(histories("show", f"--store={store}", f"--user_id={raw_user}", "--max_len=5").stdout)
    # First-day issue (4): every click keeps its time from the log (were 0 without --time_gap)
    times = sequences.click_times[start:start + length][-5:]
    assert shown["user_id"] == raw_user and shown["times"] == times.tolist() and times.min() > 1_500_000_000
    assert shown["items"] == raw_items[sequences.items[start:start + length]][-5:].tolist()
    log = tmp_path / "live.csv"
    log.write_text(f"{raw_user},555,777,pv,1600000000\n{raw_user},556,778,buy,1600000001\n")
    appended = histories("append", f"--store={store}", f"--input={log}", "--columns=user=0,item=1,category=2,"
                         "action=3,time=4", "--click=pv")
    assert appended.returncode == 0 and "appended 1 clicks" in appended.stdout, appended.stderr
    streamed = histories("append", f"--store={store}", "--input=-", "--columns=user=0,item=1,category=2,time=3",
                         stdin=f"{raw_user},557,779,1600000002\n42,1,2,5\n")
    assert streamed.returncode == 0 and "appended 2 clicks from standard input" in streamed.stdout, streamed.stderr
    shown = json.loads(histories("show", f"--store={store}", f"--user_id={raw_user}", "--max_len=2").stdout)
    assert shown == {"user_id": raw_user, "items": [555, 557], "categories": [777, 779],
                     "times": [1600000000, 1600000002]}
    # A day of the log the dataset was prepared from, read by its preset (clicks only).
    day = tmp_path / "day.csv"
    day.write_text(f"{raw_user},558,780,pv,1600000003\n{raw_user},559,781,cart,1600000004\n")
    by_preset = histories("append", f"--store={store}", f"--input={day}", "--dataset=taobao")
    assert by_preset.returncode == 0 and "appended 1 clicks" in by_preset.stdout, by_preset.stderr
    shown = json.loads(histories("show", f"--store={store}", f"--user_id={raw_user}", "--max_len=1").stdout)
    assert shown["items"] == [558]
    # Issue 45 (11): a garbage line read first from standard input is named as the line it is.
    garbage = histories("append", f"--store={store}", "--input=-", "--columns=user=0,item=1,category=2,time=3",
                        stdin="garbage\n")
    assert garbage.returncode == 1 and garbage.stderr.strip().splitlines() == [
        "error: standard input (the batch from line 1):1: 1 field(s) ('garbage'), but --columns=item=1 reads field 1 "
        "(0-based): a malformed line, or a field past the line's (pass --header if it names the columns); 0 clicks "
        "of standard input were appended in all"], garbage.stderr
    for args, message in [
            (("show", f"--store=lmdb:{tmp_path / 'none'}", "--user_id=1"), "not a history store (no data.mdb"),
            (("show", f"--store={store}", "--user_id=99999999999999999999"), "--user_id=99999999999999999999: does "
                                                                             "not fit int64"),
            (("show", "--store=redis://127.0.0.1:1", "--user_id=1"), "redis://127.0.0.1:1: no Redis server answers"),
            (("append", f"--store={store}", "--input=-", "--format=parquet", "--columns=user=0,item=1,time=2"),
             "--format=parquet reads a file: give --input=FILE, not -"),
            (("drop", f"--store={store}"), "give one command of load, append, show; got drop"),
            (("append", f"--store={store}", f"--input={day}", "--dataset=taobao", "--columns=user=0,item=1,time=2"),
             "--dataset=taobao is a preset: it cannot be combined with --columns"),
            (("append", f"--store={store}", f"--input={day}"), "name the log's format: --dataset=taobao|tmall")]:
        failed = histories(*args)
        lines = failed.stderr.strip().splitlines()
        assert failed.returncode != 0 and len(lines) == 1 and message in lines[0], failed.stderr


def test_a_dataset_with_fields_loads_them_and_live_clicks_carry_them(tmp_path):
    """`load` of a dataset with column fields and the time gap: the store keeps the
    fields' raw values and the clicks' times; `append` reads them from the log's
    field columns, and a log without them is refused in one line naming them."""
    from dare_tf.data.preparation.in_memory import prepare
    from tests.data.storage.test_fields import FORMAT, PER_USER, field_rows, write_log

    rows = field_rows()
    data = str(tmp_path / "data")
    prepare(FORMAT, write_log(tmp_path / "log.csv", rows), data, PER_USER)
    store = f"lmdb:{tmp_path / 'histories'}"
    assert histories("load", f"--data_dir={data}", f"--store={store}").returncode == 0
    user = rows[0][0]
    mine = sorted((r for r in rows if r[0] == user), key=lambda r: r[5])
    live = tmp_path / "live.csv"
    live.write_text(f"{user},7,1,,9,{mine[-1][5] + 1}\n")
    columns = "--columns=user=0,item=1,category=2,time=5,field:brand=3,field:shop=4"
    appended = histories("append", f"--store={store}", f"--input={live}", columns)
    assert appended.returncode == 0, appended.stderr
    shown = json.loads(histories("show", f"--store={store}", f"--user_id={user}", "--max_len=4").stdout)
    # the last 3 loaded clicks (with their times: the dataset has --time_gap), then the live one
    assert shown["times"] == [r[5] for r in mine[-3:]] + [mine[-1][5] + 1]
    assert shown["shop"] == [r[4] for r in mine[-3:]] + [9] and shown["items"][-1] == 7
    assert shown["brand"] == [r[3] if r[3] != "" else -1 - r[1] for r in mine[-3:]] + [-8]  # (empty: the item's own)
    refused = histories("append", f"--store={store}", f"--input={live}", "--columns=user=0,item=1,category=2,time=5")
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        f"error: {store}: the store's clicks have the fields ['brand', 'shop'], not []: a store keeps the fields it "
        "was created with; read brand, shop from the log too (a preset's log: --fields=brand,shop; --columns: "
        "field:brand=COLUMN,field:shop=COLUMN) or use another store"], refused.stderr


def test_load_refuses_a_store_holding_other_clicks_or_a_killed_load(taobao, tmp_path):
    """Issue 45 (6): `load` into a store that holds live clicks, or a load that was
    killed, would add clicks twice: refused in one line; the store unchanged."""
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import LOADING

    store = f"lmdb:{tmp_path / 'live'}"
    log = tmp_path / "live.csv"
    log.write_text("7,555,777,1600000000\n")
    assert histories("append", f"--store={store}", f"--input={log}", "--columns=user=0,item=1,category=2,"
                     "time=3").returncode == 0
    refused = histories("load", f"--data_dir={taobao}", f"--store={store}")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"error: {store}: holds 1 users already (clicks loaded or appended before); a load fills an empty store, "
        "since loading into this one would add clicks twice: give a new store"], refused
    with open_store(store) as opened:  # as a load killed after its first write leaves it
        opened.note(LOADING, f"{DatasetSpec.load(taobao).preparation} {taobao}")
    refused = histories("load", f"--data_dir={taobao}", f"--store={store}")
    assert refused.returncode == 1 and f"holds 1 users already (a load of {taobao} that did not finish)" in (
        refused.stderr), refused
    with open_store(store, read_only=True) as opened:
        assert len(opened) == 1 and opened.size(7) == 1


def test_a_dataset_prepared_before_the_store_kept_times_loads_them_as_unknown(taobao, tmp_path):
    """First-day issue (4): a dataset prepared before its store kept every click's time (spec.json's
    store features without `times`) still reads, and its clicks load with time 0, which `recommend`
    and the inspect page read as "time unknown"."""
    import shutil

    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared

    old = str(tmp_path / "old")
    shutil.copytree(taobao, old)
    with open(os.path.join(old, "spec.json")) as f:
        raw = json.load(f)
    del raw["features"]["store"]["times"]
    with open(os.path.join(old, "spec.json"), "w") as f:
        json.dump(raw, f)
    spec = DatasetSpec.load(old)
    assert not spec.store_times and DatasetSpec.load(taobao).store_times
    sequences = SequenceStore.load(old, spec, click_times=True)
    assert sequences.click_times is None and sequences.times is None
    with open_store(f"lmdb:{tmp_path / 'h'}") as store:
        loaded = load_prepared(store, old)
        some = next(iter(store.users()))
        assert loaded.clicks == loaded.kept == len(sequences.items) and (store.last([some]).times == 0).all()


def test_a_lifelong_history_is_kept_whole_and_the_load_says_what_it_kept(taobao, tmp_path):
    """Issue 69 (1): the store kept each user's last max_len (200) clicks and said it loaded
    them all; a store keeps the whole history up to --max_clicks (default 10,000), and the
    load line counts what it kept."""
    spec = DatasetSpec.load(taobao)
    sequences = SequenceStore.load(taobao, spec, click_times=True)
    users = np.flatnonzero(sequences.length)
    longest = int(users[np.argmax(sequences.length[users])])
    start, length = sequences.start[longest], sequences.length[longest]
    assert length > spec.max_len  # a history longer than the training window
    raw_user = int(read_id_map(taobao, "user")[longest - 1])
    raw_items = np.array([0] + [int(r) for r in read_id_map(taobao, "item")])
    whole = f"lmdb:{tmp_path / 'whole'}"
    assert histories("load", f"--data_dir={taobao}", f"--store={whole}").returncode == 0
    shown = json.loads(histories("show", f"--store={whole}", f"--user_id={raw_user}").stdout)
    assert shown["items"] == raw_items[sequences.items[start:start + length]].tolist()
    cut = f"lmdb:{tmp_path / 'cut'}"
    loaded = histories("load", f"--data_dir={taobao}", f"--store={cut}", "--max_clicks=150")
    kept = int(np.minimum(sequences.length[users], 150).sum())
    assert loaded.stdout.strip() == (f"{cut}: loaded {len(users)} users from {taobao}: kept {kept} of "
                                     f"{len(sequences.items)} clicks (the last 150 per user: --max_clicks)")
    shown = json.loads(histories("show", f"--store={cut}", f"--user_id={raw_user}").stdout)
    assert shown["items"] == raw_items[sequences.items[start:start + length]][-150:].tolist()


def test_an_id_past_the_longest_is_refused_in_one_line_by_append(tmp_path):
    """Issue 68 (4), the repro: a 1,000,002-character item id (past the csv module's field limit)
    in `append --string_ids` is one line naming the file, line, field and the longest id, its
    text cut; the store holds nothing of it."""
    path = tmp_path / "hs_1mb.csv"
    path.write_text(f"u1,i-{'I' * 1_000_000},c1,pv,2020-01-01T00:00:00Z\n")
    done = histories("append", "--string_ids", f"--store=lmdb:{tmp_path / 'h1mb'}", f"--input={path}",
                     "--format=csv", "--columns=user=0,item=1,category=2,action=3,time=4", "--click=pv")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert done.stderr.startswith(f"error: {path}:1: item (column '1') is longer than the 4,096 characters a string "
                                  f"id may hold (1,000,002): 'u1,i-{'I' * 295}'... (1,000,032 characters) (use "
                                  "--skip_bad_lines"), done.stderr[:600]
    shown = histories("show", f"--store=lmdb:{tmp_path / 'h1mb'}", "--user_id=u1")
    assert shown.returncode == 0 and json.loads(shown.stdout)["items"] == [], shown.stdout + shown.stderr


def test_append_reads_the_logs_unit_and_zone(tmp_path):
    """Issue 69 (2): `append` of a log in milliseconds is refused naming --time_unit=ms, and
    reads it with the flag; `--time_zone` reads zone-less local times."""
    store = f"lmdb:{tmp_path / 'h'}"
    log = tmp_path / "ms.csv"
    log.write_text("5,101,7,1793523600000\n5,102,7,1793523660000\n")
    columns = "--columns=user=0,item=1,category=2,time=3"
    refused = histories("append", f"--store={store}", f"--input={log}", columns)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: {log}: time (column '3'): 1793523660000 read as seconds is past the year 2200; as milliseconds it "
        "is 2026-11-01 09:01:00 UTC (1793523660): give --time_unit=ms"), refused.stderr
    assert histories("append", f"--store={store}", f"--input={log}", columns, "--time_unit=ms").returncode == 0
    local = tmp_path / "local.csv"
    local.write_text("5,103,7,2026-11-01 10:02:00\n")
    assert histories("append", f"--store={store}", f"--input={local}", columns,
                     "--time_zone=Europe/Paris").returncode == 0
    shown = json.loads(histories("show", f"--store={store}", "--user_id=5").stdout)
    assert shown["items"] == [101, 102, 103] and shown["times"] == [1793523600, 1793523660, 1793523720]
