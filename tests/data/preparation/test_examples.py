"""dare_tf.data.preparation.examples: `--split=time` against a brute-force recount of the raw log
(every example's window, target, history strictly before its time, negatives), both
drivers record for record, and its one-line refusals. (The per-user protocol's
examples are checked in tests/data/preparation/test_prepare.py.)"""

import csv
import dataclasses
import datetime

import numpy as np
import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import SPLITS
from dare_tf.data.storage.id_maps import read_id_map
from tests.data.planted_logs import impression_log
from tests.data.preparation.test_prepare import TAOBAO, assert_same_datasets
from tests.programs import run_program

DAY = 86_400
TIME = Protocol(split="time", min_clicks=50, partitions=3, seed=4)


def _examples(directory, split):
    return InMemorySplit.load(directory, split, max_len=1).columns


def _timed_clicks():
    """Each user's clicks (raw item, raw category, time) in time order (stable: file
    order within a second), recounted from the raw file."""
    users = {}
    with open(TAOBAO, newline="") as f:
        for user, item, category, action, time in csv.reader(f):
            if action == "pv":
                users.setdefault(user, []).append((item, category, int(time)))
    return {u: sorted(s, key=lambda r: r[2]) for u, s in users.items()}


@pytest.fixture(scope="module")
def by_time(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("time") / "taobao")
    return out, prepare("taobao", TAOBAO, out, TIME)


def test_time_split_examples_are_the_windows_clicks_with_their_past_only(by_time):
    """Recounted from the raw log: a click is a target when it has an earlier click
    and its user's clicks up to the end of its day reach min_clicks; its negatives
    are items clicked (by anyone) up to the end of that day, none clicked by the
    user up to then, each with its category as of that day."""
    directory, spec = by_time
    clicks = _timed_clicks()
    last = max(t for s in clicks.values() for _, _, t in s)
    test_from = (last // DAY) * DAY  # the log's last UTC day: 2017-12-03
    assert datetime.datetime.fromtimestamp(test_from, datetime.timezone.utc).date() == datetime.date(2017, 12, 3)
    assert spec.protocol["windows"] == {"train": None, "val": test_from - DAY, "test": test_from}
    bounds = [test_from - DAY, test_from]
    raw_items, raw_cats, raw_users = (read_id_map(directory, k) for k in ("item", "category", "user"))
    rows = {}  # item -> its rows (time, category), in time order (file order within a second)
    with open(TAOBAO, newline="") as f:
        for _, item, category, action, time in csv.reader(f):
            if action == "pv":
                rows.setdefault(item, []).append((int(time), category))
    for item in rows:
        rows[item].sort(key=lambda r: r[0])

    def category_as_of(item, day):  # the category of the item's last row up to the end of `day`
        times = [t for t, _ in rows[item]]
        upto = int(np.searchsorted(times, (day + 1) * DAY, side="left"))
        assert upto > 0, (item, day)  # clicked up to that day
        return rows[item][upto - 1][1]
    expected = {split: [] for split in SPLITS}
    for user, seq in clicks.items():
        times = np.array([t for _, _, t in seq])
        for i, (item, category, t) in enumerate(seq):
            position = int(np.searchsorted(times, t, side="left"))  # clicks strictly before
            through_day = int(np.searchsorted(times, (t // DAY + 1) * DAY, side="left"))
            if position and through_day >= TIME.min_clicks:
                split = SPLITS[int(np.searchsorted(bounds, t, side="right"))]
                expected[split].append((user, position, item, category))
    total = 0
    for split in SPLITS:
        ex = _examples(directory, split)
        labels = ex["label"].reshape(-1, 3)
        assert (labels == [1, 0, 0]).all()
        positives = [(raw_users[u - 1], int(p), raw_items[i - 1], raw_cats[c - 1]) for u, p, i, c in zip(
            ex["uid"][::3], ex["position"][::3], ex["target_item"][::3], ex["target_category"][::3])]
        # Each partition's shard holds its users in dense-id order: compare as multisets per user.
        assert sorted(positives) == sorted(expected[split]), split
        for row in range(0, len(ex["label"]), 3):
            user, position = raw_users[ex["uid"][row] - 1], int(ex["position"][row])
            day = clicks[user][position][2] // DAY  # the target's day
            until = {item for item, _, t in clicks[user] if t < (day + 1) * DAY}
            for i, c in zip(ex["target_item"][row + 1: row + 3], ex["target_category"][row + 1: row + 3]):
                assert raw_items[i - 1] not in until
                assert category_as_of(raw_items[i - 1], day) == raw_cats[c - 1]
        total += len(positives)
    assert spec.counts == {s: 3 * len(expected[s]) for s in SPLITS} and total > 1000
    # The store is each user's clicks in time order: a history (the first `position`
    # clicks) is what came strictly before its target.
    store = InMemorySplit.load(directory, "test", max_len=200)
    row = 0
    user = raw_users[store.columns["uid"][row] - 1]
    hist = [(raw_items[i - 1], raw_cats[c - 1]) for i, c in zip(store.features["hist_items"][row],
                                                                 store.features["hist_categories"][row]) if i > 0]
    position = int(store.columns["position"][row])
    assert hist == [(i, c) for i, c, _ in clicks[user][max(0, position - 200): position]]
    assert all(t < bounds[1] for _, _, t in clicks[user][:position])


def test_time_split_ids_follow_first_appearance_in_time_so_first_days_extend(by_time, tmp_path):
    """The id maps of the log's days before the last are the beginning of the whole
    log's: a model of those days continues on the whole log (trainers.train --init_from)."""
    directory, _ = by_time
    last_day = (max(t for s in _timed_clicks().values() for _, _, t in s) // DAY) * DAY
    early = tmp_path / "early.csv"
    with open(TAOBAO) as f, open(early, "w") as out:
        out.writelines(line for line in f if int(line.rsplit(",", 1)[1]) < last_day)
    prepare("taobao", str(early), str(tmp_path / "early"), dataclasses.replace(TIME, test_days=1, val_days=1))
    for kind in ("item", "category", "user"):
        before, after = read_id_map(str(tmp_path / "early"), kind), read_id_map(directory, kind)
        assert after[: len(before)] == before, kind
        assert len(before) < len(after) or kind == "user", kind  # (the last day brought no new user)


def test_the_default_split_is_recorded_and_identified_as_before(by_time, tmp_path):
    spec = prepare("taobao", TAOBAO, str(tmp_path / "user"), dataclasses.replace(TIME, split="user",
                                                                                 min_clicks=210))
    assert not {"split", "val_days", "test_days", "val_from", "test_from", "windows"} & set(spec.protocol)
    assert spec.counts == {"train": 86 * 19 * 3, "val": 86 * 3, "test": 86 * 3}


@pytest.mark.slow
def test_both_drivers_write_the_same_time_split(tmp_path):
    from dare_tf.data.preparation import beam as beam_driver

    part = tmp_path / "part.csv"  # the sample's first 30,000 rows: several blocks, Beam in a fraction of the time
    with open(TAOBAO) as f:
        part.write_text("".join(line for _, line in zip(range(30_000), f)))
    prepare("taobao", str(part), str(tmp_path / "memory"), dataclasses.replace(TIME, min_clicks=20))
    beam_driver.prepare("taobao", str(part), str(tmp_path / "beam"), dataclasses.replace(TIME, min_clicks=20),
                        block_bytes=1 << 18, buckets=3)
    assert_same_datasets(str(tmp_path / "memory"), str(tmp_path / "beam"))
    # An impression log with explicit window starts: every impression an example of its window.
    fmt, log, protocol = impression_log(tmp_path)
    protocol = dataclasses.replace(protocol, split="time", val_from=1_700_006_000, test_from=1_700_008_000)
    memory = prepare(fmt, log, str(tmp_path / "imp-memory"), protocol)
    beam_driver.prepare(fmt, log, str(tmp_path / "imp-beam"), protocol, block_bytes=4096, buckets=2)
    assert_same_datasets(str(tmp_path / "imp-memory"), str(tmp_path / "imp-beam"))
    assert memory.counts["train"] + memory.counts["val"] + memory.counts["test"] == 40 * 30
    times = {"train": (None, 1_700_006_000), "val": (1_700_006_000, 1_700_008_000), "test": (1_700_008_000, None)}
    assert memory.protocol["windows"] == {s: lo for s, (lo, _) in times.items()}


def test_time_split_refusals_are_one_line(tmp_path):
    for fields, message in [
        (dict(split="days"), "split=days: must be one of ('user', 'time')"),
        (dict(split="time", val_days=0), "val_days=0: must be >= 1"),
        (dict(split="time", val_from=5), "test_from=None: --val_from and --test_from go together"),
        (dict(split="time", val_from=9, test_from=5), "val_from=9: must be before --test_from=5"),
        (dict(test_days=2), "split=user: --val_days, --test_days, --val_from and --test_from are for "
                            "--split=time"),
    ]:
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            Protocol(**fields)
    with pytest.raises(ValueError, match=r"^--split=time: the val window holds no example of the users with >= 50 "
                                         r"clicks \(train before 2033-05-18 03:33:18 UTC \(1999999998\), val from "
                                         r"2033-05-18 03:33:18 UTC \(1999999998\), test from 2033-05-18 03:33:19 UTC "
                                         r"\(1999999999\); the log's last row at 2017-12-0\d \d\d:\d\d:\d\d UTC "
                                         r"\(\d+\)\); move --val_days/--test_days"):
        prepare("taobao", TAOBAO, str(tmp_path / "late"), dataclasses.replace(
            TIME, val_from=1_999_999_998, test_from=1_999_999_999))
    done = run_program("data.prepare", "--dataset=taobao", f"--input={TAOBAO}", f"--output_dir={tmp_path / 'cli'}",
                       "--val_days=2")
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [
        "error: --split=user: --val_days, --test_days, --val_from and --test_from are for --split=time (see "
        "--help)"], done.stderr


def test_a_generated_log_of_n_days_spreads_every_user_over_its_days(tmp_path):
    from dare_tf.data.generation.synthetic import SyntheticConfig, write

    write(SyntheticConfig(users=60, items=500, categories=20, min_length=30, max_length=200, days=4, seed=2),
          str(tmp_path / "log.csv"))
    users = {}
    with open(tmp_path / "log.csv", newline="") as f:
        for user, _, _, _, time in csv.reader(f):
            users.setdefault(user, []).append(int(time) // DAY)
    first = min(min(d) for d in users.values())
    assert datetime.datetime.fromtimestamp(first * DAY, datetime.timezone.utc).date() == datetime.date(2017, 11, 24)
    assert {(min(d) - first, max(d) - first) for d in users.values()} == {(0, 3)}  # day 1 to day 4, every user
    with pytest.raises(ValueError, match="^days=-1: must be >= 0$"):
        SyntheticConfig(days=-1)
