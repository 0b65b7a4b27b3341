"""dare_tf.data.preparation.append (`data.prepare --append`): days appended one by one write
what preparing all the days at once writes, record for record (click and
impression logs); only the partitions with new rows get a new store shard; a
killed append leaves the dataset as it was or is finished by the next one;
and its one-line refusals."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from dare_tf.data.preparation import append as append_module
from dare_tf.data.preparation import journal as journal_module
from dare_tf.data.preparation.append import append
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import (APPEND_JOURNAL, ID_MAP_FILES, ITEM_CATEGORY_FILE, ITEM_CLICKS_FILE,
                               SPLITS, DatasetSpec, SpecError)
from dare_tf.data.storage.store import SequenceStore, read_examples
from dare_tf.data.storage.fields import FieldSchema
from tests.conftest import LOUD_ENV, REPO, noise
from tests.data.planted_logs import impression_log, impression_rows
from tests.data.preparation.test_prepare import TAOBAO
from tests.programs import run_program

DAY = 86_400
TIME = Protocol(split="time", min_clicks=50, partitions=3, seed=4)


def _days(path, first, last, out, column=-1):
    """The lines of `path` (a header kept) whose day (time in field `column`) is in [first, last]."""
    with open(path) as f:
        lines = f.readlines()
    header = [] if lines[0].split(",")[column].strip().isdigit() else lines[:1]
    with open(out, "w") as f:
        f.writelines(header + [line for line in lines[len(header):]
                               if first <= int(line.strip().split(",")[column]) // DAY <= last])
    return str(out)


def _day_numbers(path):
    with open(path) as f:
        return sorted({int(line.rsplit(",", 1)[1]) // DAY for line in f if line.rsplit(",", 1)[1].strip().isdigit()})


def assert_same_data(a, b):
    """Id maps, item categories, the store and every split's examples (in order) equal."""
    spec_a, spec_b = DatasetSpec.load(a), DatasetSpec.load(b)
    for name in (*ID_MAP_FILES.values(), ITEM_CATEGORY_FILE, ITEM_CLICKS_FILE, *FieldSchema.of(spec_a.fields).files()):
        assert open(os.path.join(a, name)).read() == open(os.path.join(b, name)).read(), name
    store_a, store_b = SequenceStore.load(a, spec_a), SequenceStore.load(b, spec_b)
    for field in ("items", "categories", "start", "length"):
        np.testing.assert_array_equal(getattr(store_a, field), getattr(store_b, field), err_msg=field)
    assert store_a.fields.keys() == store_b.fields.keys() and spec_a.fields == spec_b.fields
    for name, values in store_a.fields.items():
        np.testing.assert_array_equal(values, store_b.fields[name], err_msg=name)
    np.testing.assert_array_equal(store_a.times, store_b.times)
    for split in SPLITS:
        ex_a, ex_b = read_examples(a, split, spec_a), read_examples(b, split, spec_b)
        for column in ex_a:
            np.testing.assert_array_equal(ex_a[column], ex_b[column], err_msg=f"{split}.{column}")
    for field in ("num_items", "num_categories", "num_users", "users", "counts", "shards", "clicks_stored"):
        assert getattr(spec_a, field) == getattr(spec_b, field), field
    assert spec_a.protocol == spec_b.protocol


@pytest.fixture(scope="module")
def taobao_days(tmp_path_factory):
    """The Taobao sample prepared by time at once (`whole`), and its days but the
    last two (`base`, to be appended to)."""
    root = tmp_path_factory.mktemp("append")
    days = _day_numbers(TAOBAO)
    whole = str(root / "whole")
    prepare("taobao", TAOBAO, whole, TIME)
    base = root / "base"
    prepare("taobao", _days(TAOBAO, 0, days[-3], root / "base.csv"), str(base), TIME)
    return root, days, whole, str(base)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def test_days_appended_one_by_one_are_the_days_prepared_at_once(taobao_days, tmp_path):
    root, days, whole, base = taobao_days
    grown = _copy(base, tmp_path / "grown")
    before = DatasetSpec.load(grown)
    spec = append(_days(TAOBAO, days[-2], days[-2], tmp_path / "day1.csv"), grown)
    assert spec.protocol["windows"]["test"] == days[-2] * DAY  # the new day is the test window
    last_day = _days(TAOBAO, days[-1], days[-1], tmp_path / "day2.csv")
    # Issue 45 (11): a history store that cannot be opened refuses the day before the dataset takes it.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("mine")
    refused = run_program("data.prepare", "--append", f"--output_dir={grown}", f"--input={last_day}",
                          f"--histories=lmdb:{tmp_path / 'notes'}")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"error: lmdb:{tmp_path / 'notes'}: not a history store (no data.mdb in {tmp_path / 'notes'}); give an empty "
        "or new directory"], refused.stderr
    assert DatasetSpec.load(grown) == spec  # the day was not appended
    histories = f"lmdb:{tmp_path / 'histories'}"
    command = [sys.executable, "-m", "data.prepare", "--append", f"--output_dir={grown}", f"--input={last_day}",
               f"--histories={histories}"]
    done = subprocess.run(command, cwd=REPO, env=LOUD_ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not noise(done.stdout + done.stderr), done.stderr  # no TensorFlow INFO line, in a user's environment
    assert_same_data(whole, grown)
    # The same program appended the day's clicks to the history service, once.
    with open(last_day) as f:
        rows = [line.strip().split(",") for line in f if line.split(",")[3] == "pv"]
    user = rows[0][0]
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and f"{histories}: not appended: {last_day} was in the dataset already" in again.stdout
    from dare_tf.histories import open_store

    with open_store(histories, read_only=True) as store:
        history = store.last([int(user)]).to_json(0, int(user))
    mine = sorted((int(t), int(i), int(c)) for u, i, c, _, t in rows if u == user)
    assert sorted(zip(history["times"], history["items"], history["categories"])) == mine
    spec = DatasetSpec.load(grown)
    assert [a["sha256"] for a in spec.source["appended"]] and spec.source["last_time"] == DatasetSpec.load(
        whole).source["last_time"]
    assert spec.preparation != before.preparation
    # Users who reach min_clicks on an appended day have examples from that day on.
    assert spec.users > before.users
    # Nothing is left beside what spec.json lists.
    assert sorted(os.listdir(grown)) == sorted({"spec.json", *ID_MAP_FILES.values(), ITEM_CATEGORY_FILE,
                                                ITEM_CLICKS_FILE, *spec.files})


def test_the_day_is_parsed_once_for_the_dataset_and_the_history_service(taobao_days, tmp_path):
    """Issue 46: `data.prepare --append --histories` reads the day's log once (the
    reader's calls counted in the program's process), and the store gets the day's
    clicks."""
    root, days, _, base = taobao_days
    grown = _copy(base, tmp_path / "grown")
    day = _days(TAOBAO, days[-2], days[-2], tmp_path / "day.csv")
    counting = ("import runpy, sys\nfrom dare_tf.data.logs import reader as log_reader\ncalls = []\n"
                "read = log_reader.read_clicks\n"
                "log_reader.read_clicks = lambda *a, **k: calls.append(a[0]) or read(*a, **k)\n"
                "sys.argv = ['prepare'] + sys.argv[1:]\ntry:\n"
                "    runpy.run_module('data.prepare', run_name='__main__', alter_sys=True)\n"
                "except SystemExit:\n    pass\nprint('reads', len(calls))\n")
    done = subprocess.run([sys.executable, "-c", counting, "--append", f"--output_dir={grown}", f"--input={day}",
                           f"--histories=lmdb:{tmp_path / 'histories'}"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "reads 1", done.stdout + done.stderr
    with open(day) as f:
        clicks = sum(1 for line in f if line.split(",")[3] == "pv")
    assert f"lmdb:{tmp_path / 'histories'}: appended {clicks} clicks" in done.stdout


def test_only_the_partitions_with_new_rows_get_a_new_store_shard(taobao_days, tmp_path):
    root, days, whole, base = taobao_days
    grown = _copy(base, tmp_path / "grown")
    before = DatasetSpec.load(grown)
    day = _days(TAOBAO, days[-2], days[-2], tmp_path / "day.csv")
    with open(day) as f:
        first_user = f.readline().split(",")[0]
    with open(day) as f:
        one_user = [line for line in f if line.split(",")[0] == first_user]
    (tmp_path / "one.csv").write_text("".join(one_user))
    spec = append(str(tmp_path / "one.csv"), grown)
    changed = [k for k in range(TIME.partitions) if spec.store[k] != before.store[k]]
    assert len(changed) == 1
    for k in set(range(TIME.partitions)) - set(changed):
        assert spec.files[spec.store[k]] == before.files[before.store[k]]
    assert spec.store[changed[0]].startswith(f"store-{days[-2] * DAY}-")


def test_a_log_with_fields_and_the_time_gap_appends_as_it_prepares(tmp_path):
    """Fields (a brand with empty cells, a shop) and the time gap over 5 days: days 1-3
    prepared, 4 and 5 appended; a new brand on an appended day grows its id map."""
    from tests.data.storage.test_fields import FORMAT, TIME, field_rows, write_log

    rows = field_rows()
    rows.append((500, 7, 1, 999, 104, max(r[5] for r in rows)))  # a brand first seen on the last day
    log = write_log(tmp_path / "log.csv", rows)
    days = sorted({r[5] // DAY for r in rows})
    protocol = dataclasses.replace(TIME, min_clicks=5)
    prepare(FORMAT, log, str(tmp_path / "whole"), protocol)
    prepare(FORMAT, _days(log, 0, days[-3], tmp_path / "base.csv", 5), str(tmp_path / "grown"), protocol)
    before = DatasetSpec.load(str(tmp_path / "grown")).field("brand")["vocabulary"]
    for day in days[-2:]:
        append(_days(log, day, day, tmp_path / f"{day}.csv", 5), str(tmp_path / "grown"))
    assert_same_data(str(tmp_path / "whole"), str(tmp_path / "grown"))
    assert DatasetSpec.load(str(tmp_path / "grown")).field("brand")["vocabulary"] > before


def test_an_impression_log_appends_as_it_prepares(tmp_path):
    """A planted impression log spread over 5 days: days 1-3 prepared, 4 and 5 appended."""
    rows = [(u, i, c, 1_700_000_000 + (t - 1_700_000_000) * 40, y) for u, i, c, t, y in impression_rows(3)]
    fmt, _, protocol = impression_log(tmp_path)
    log = tmp_path / "imp.csv"
    log.write_text("visitor,product,cat,ts,clicked\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    protocol = dataclasses.replace(protocol, split="time")
    days = sorted({r[3] // DAY for r in rows})
    prepare(fmt, str(log), str(tmp_path / "whole"), protocol)
    prepare(fmt, _days(log, 0, days[-3], tmp_path / "base.csv", 3), str(tmp_path / "grown"), protocol)
    for day in days[-2:]:
        append(_days(log, day, day, tmp_path / f"{day}.csv", 3), str(tmp_path / "grown"), fmt)
    assert_same_data(str(tmp_path / "whole"), str(tmp_path / "grown"))
    # A log read with other fields than the dataset's is refused, naming the difference.
    other = dataclasses.replace(fmt, columns=tuple(c for c in fmt.columns if c[0] != "category"))
    with pytest.raises(ValueError, match=r"^--append: .* is read as 'csv' with columns=\[\['user', 'visitor'\], "
                                         r"\['item', 'product'\], \['time', 'ts'\], \['label', 'clicked'\]\], but "
                                         r".* holds a 'csv' log with columns=\[\['user', 'visitor'\], \['item', "
                                         r"'product'\], \['category', 'cat'\], "):
        append(str(log), str(tmp_path / "grown"), other)


def test_a_killed_append_leaves_the_dataset_as_it_was_or_is_finished_by_the_next(taobao_days, tmp_path,
                                                                                  monkeypatch):
    root, days, whole, base = taobao_days
    day = _days(TAOBAO, days[-2], days[-2], tmp_path / "day.csv")
    clean = _copy(base, tmp_path / "clean")
    append(day, clean)
    # Killed before its commit: the dataset reads as before; the next append removes the leftovers.
    killed = _copy(base, tmp_path / "killed")
    listing = sorted(os.listdir(killed))

    def killed_at_commit(data_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(journal_module, "commit", killed_at_commit)
    with pytest.raises(KeyboardInterrupt):
        append(day, killed)
    monkeypatch.undo()
    os.remove(os.path.join(killed, APPEND_JOURNAL))  # killed before the journal was renamed into place
    assert sorted(set(os.listdir(killed)) - set(listing))  # its new shards and id maps lie there
    assert DatasetSpec.load(killed) == DatasetSpec.load(base)
    assert_same_data(base, killed)
    append(day, killed)
    assert_same_data(clean, killed)
    assert sorted(os.listdir(killed)) == sorted(os.listdir(clean))
    # Killed during its commit (after the id maps were renamed): refused when read, finished by the next append.
    halfway = _copy(base, tmp_path / "halfway")
    real_replace = os.replace

    def replace(src, dst):
        if dst.endswith("spec.json"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        append(day, halfway)
    monkeypatch.undo()
    with pytest.raises(SpecError, match=f"^{halfway}: an append \\(data.prepare --append\\) is committing, or was "
                                        "stopped while it committed; if none runs, run python -m data.prepare "
                                        f"--append --output_dir={halfway} --input=LOG again to finish it$"):
        DatasetSpec.load(halfway)
    append(day, halfway)  # finishes the commit; the same log again is then nothing to append
    assert_same_data(clean, halfway)
    assert DatasetSpec.load(halfway) == DatasetSpec.load(clean)


def test_what_cannot_be_appended_is_refused_in_one_line(taobao_days, tmp_path, taobao):
    root, days, whole, base = taobao_days
    original = DatasetSpec.load(base)
    day = _days(TAOBAO, days[-2], days[-2], tmp_path / "day.csv")
    late = _days(TAOBAO, days[-3], days[-2], tmp_path / "late.csv")
    cases = [
        ([f"--output_dir={taobao}", f"--input={day}"],
         f"error: --append: {taobao} was prepared with --split=user (the paper's per-user protocol); a day can be "
         "appended to a --split=time dataset only: prepare it with --split=time"),
        ([f"--output_dir={base}", f"--input={day}", "--dataset=tmall"],
         f"error: --append: {day} is read as 'tmall' with name=tmall, but {base} holds a 'taobao' log with "
         "name=taobao; append a log of the dataset's format and fields (or give no format flags)"),
        ([f"--output_dir={base}", f"--input={late}"],
         f"error: --append: {late}: "),
        ([f"--output_dir={base}", f"--input={day}", "--min_clicks=3"],
         "error: --append takes the dataset's protocol and files: drop --min_clicks (see --help)"),
        ([f"--output_dir={tmp_path / 'none'}", f"--input={day}"],
         f"error: --append: {tmp_path / 'none' / 'spec.json'} not found: --output_dir must be a dataset prepared "
         "with --split=time"),
    ]
    for args, message in cases:
        done = run_program("data.prepare", "--append", *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith(message), done.stderr
    last = days[-3]
    import datetime

    name = (datetime.date(1970, 1, 1) + datetime.timedelta(days=last)).isoformat()
    with open(late) as f:
        on_last = sum(int(line.rsplit(",", 1)[1]) // DAY == last and line.split(",")[3] == "pv" for line in f)
    with pytest.raises(ValueError, match=f"^--append: {late}: {on_last} of its \\d+ rows are on or before {name}, "
                                         "the dataset's last day \\(the first at time \\d+\\); a day is appended "
                                         "once, after the days the dataset holds \\(pass --allow_late to drop "
                                         "those rows\\)$"):
        append(late, base)
    # One writer at a time (the lock beside the dataset, held as a live writer holds it).
    import fcntl

    with open(os.path.join(os.path.dirname(os.path.realpath(base)), f".{os.path.basename(base)}.lock"), "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.truncate(0)
        held.write("pid 4242: data.prepare --append")
        held.flush()
        with pytest.raises(ValueError, match=f"^data.prepare --append: another writer is changing "
                                             f"{os.path.realpath(base)} \\(pid 4242: data.prepare --append\\); one "
                                             "writer at a time: wait for it to end$"):
            append(day, base)
        # Issue 59 (11): another program's flock, which records nothing: the trainer's words, `pid unknown`.
        held.truncate(0)
        held.flush()
        with pytest.raises(ValueError, match=f"^data.prepare --append: another writer is changing "
                                             f"{os.path.realpath(base)} \\(pid unknown\\); one writer at a time"):
            append(day, base)
    # --allow_late drops them and counts them: the same as appending the new day alone.
    grown, alone = _copy(base, tmp_path / "late"), _copy(base, tmp_path / "alone")
    spec = append(late, grown, allow_late=True)
    append(day, alone)
    assert spec.source["appended"][-1]["late_rows"] == on_last
    assert_same_data(alone, grown)
    assert DatasetSpec.load(base) == original  # every refusal left the dataset as it was


def test_a_whole_preparation_into_a_dataset_being_appended_to_is_refused(taobao_days, tmp_path, monkeypatch):
    """Issue 45 (3): `data.prepare` into a dataset's directory while `data.prepare
    --append` runs there (both exited 0 and neither dataset survived) is refused in
    one line, and so is an append while a whole preparation writes it; the dataset
    is the append's alone."""
    import threading

    root, days, whole, base = taobao_days
    grown = _copy(base, tmp_path / "grown")
    day = _days(TAOBAO, days[-2], days[-2], tmp_path / "day.csv")
    inside, release, result = threading.Event(), threading.Event(), {}
    original = append_module._append

    def held(*args):  # the append, paused while it holds the dataset
        inside.set()
        release.wait(60)
        return original(*args)

    monkeypatch.setattr(append_module, "_append", held)
    writer = threading.Thread(target=lambda: result.setdefault("spec", append(day, grown)))
    writer.start()
    try:
        assert inside.wait(60)
        with pytest.raises(ValueError, match=f"^data.prepare: another writer is changing {grown} \\(pid {os.getpid()}: "
                                             "data.prepare --append\\); one writer at a time: wait for it to end$"):
            prepare("taobao", TAOBAO, grown, TIME)
    finally:
        release.set()
        writer.join()
    reference = _copy(base, tmp_path / "reference")
    monkeypatch.setattr(append_module, "_append", original)
    append(day, reference)
    assert_same_data(grown, reference)  # the append's dataset, whole

    from dare_tf.data.preparation import dataset_dir

    building = threading.Event()
    real_build = dataset_dir._write_prepared

    def slow(output_dir, input_path, build):  # a whole preparation, paused inside its lock
        building.set()
        release.clear()
        release.wait(60)
        return real_build(output_dir, input_path, build)

    monkeypatch.setattr(dataset_dir, "_write_prepared", slow)
    release.clear()
    again = _copy(base, tmp_path / "again")
    writer = threading.Thread(target=lambda: prepare("taobao", TAOBAO, again, TIME))
    writer.start()
    try:
        assert building.wait(60)
        with pytest.raises(ValueError, match=f"^data.prepare --append: another writer is changing {again} \\(pid "
                                             f"{os.getpid()}: data.prepare\\); one writer at a time: wait for it to "
                                             "end$"):
            append(day, again)
    finally:
        release.set()
        writer.join()
    assert_same_data(again, whole)  # the preparation's dataset, whole


def test_a_refused_append_leaves_no_shard_behind(taobao_days, tmp_path):
    """Issue 59 (3): a day whose rows all sit at 2^31 - 1 s (mawk's `%d` clamps there) empties the
    validation window: the append is refused naming the windows as dates, and the 32 store shards it
    had written are gone (the dataset's files are as they were)."""
    _, days, _, base = taobao_days
    grown = _copy(base, tmp_path / "grown")
    before = {name: os.path.getmtime(os.path.join(grown, name)) for name in os.listdir(grown)}
    day = tmp_path / "day2038.csv"
    with open(_days(TAOBAO, days[-2], days[-2], tmp_path / "day.csv")) as f:
        day.write_text("".join(line.rsplit(",", 1)[0] + ",2147483647\n" for line in f))
    with pytest.raises(ValueError, match=r"^--split=time: the val window holds no example of the users with >= 50 "
                       r"clicks \(train before 2038-01-18 00:00:00 UTC \(2147385600\), val from 2038-01-18 00:00:00 "
                       r"UTC \(2147385600\), test from 2038-01-19 00:00:00 UTC \(2147472000\); the log's last row at "
                       r"2038-01-19 03:14:07 UTC \(2147483647\)\); move --val_days"):
        append(str(day), grown)
    assert {name: os.path.getmtime(os.path.join(grown, name)) for name in os.listdir(grown)} == before


def test_a_log_past_2038_prepares_by_time(tmp_path):
    """Issue 59 (3): times past 2^31 s are windowed as any other (the repro's refusal came from
    mawk's `%d`, which wrote 2147483647 on every row)."""
    shifted = tmp_path / "future.csv"
    with open(TAOBAO) as f:
        shifted.write_text("".join(f"{line.rsplit(',', 1)[0]},{int(line.rsplit(',', 1)[1]) + 10**9}\n" for line in f))
    spec = prepare("taobao", str(shifted), str(tmp_path / "future"), TIME)
    last = max(int(line.rsplit(",", 1)[1]) for line in open(shifted))
    assert spec.protocol["windows"]["test"] == (last // DAY) * DAY > 2**31 and min(spec.counts.values()) > 0
