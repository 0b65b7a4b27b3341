"""Appending one day to a prepared `--split=time` dataset against preparing all its
days again: a generated log of DAYS days, its first DAYS - 1 prepared, then
`python -m data.prepare --append` of the last day, and `python -m data.prepare
--split=time` of the whole log, each in its own process (seconds and peak RSS),
in the same run. Both write the same records (tests/data/preparation/test_append.py).

What an append must read is the day's rows and the past clicks of the users
active that day (their positions and the negatives they must not have
clicked come from them); it also rewrites the store shards of their
partitions. `must_read` is that count beside the log's rows, which a whole
preparation reads. The phases of the same append run in process on a copy
(TensorFlow imported before): reading the day, reading the store shards,
building and writing the day's examples, writing the store, the commit.

Usage: python benchmarks/bench_append.py [--days 31] [--users 3000] [--partitions 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.bench_prepare import measure  # noqa: E402
from benchmarks.common import print_table, write_parts  # noqa: E402

DAY = 86_400


def split_days(log: str, work: str) -> tuple[str, str, int, int]:
    """(all but the last day, the last day, rows of the log, rows of the last day)."""
    with open(log) as f:
        lines = f.readlines()
    last = max(int(line.rsplit(",", 1)[1]) for line in lines) // DAY
    early, day = os.path.join(work, "early.csv"), os.path.join(work, "day.csv")
    with open(early, "w") as a, open(day, "w") as b:
        for line in lines:
            (b if int(line.rsplit(",", 1)[1]) // DAY == last else a).write(line)
    with open(day) as f:
        return early, day, len(lines), sum(1 for _ in f)


def _active_past_clicks(data_dir: str, day: str) -> int:
    """Stored clicks of the users who have rows in the day's log."""
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.id_maps import read_id_map
    from dare_tf.data.storage.store import SequenceStore

    dense = {raw: k for k, raw in enumerate(read_id_map(data_dir, "user"), start=1)}
    with open(day) as f:
        active = {dense[u] for u in {line.split(",", 1)[0] for line in f} if u in dense}
    store = SequenceStore.load(data_dir, DatasetSpec.load(data_dir))
    return int(store.length[sorted(active)].sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from dare_tf.data.storage.spec import DatasetSpec

    work = tempfile.mkdtemp(prefix="bench_append_")
    try:
        log = os.path.join(work, "log.csv")
        measure(["data.synthetic", f"--output={log}", f"--users={args.users}", "--items=50000", "--categories=500",
                 "--min_length=200", "--length_median=800", "--max_length=3000", f"--days={args.days}", "--seed=5"])
        early, day, log_rows, day_rows = split_days(log, work)
        protocol = ["--split=time", "--min_clicks=20", f"--partitions={args.partitions}"]
        grown = os.path.join(work, "grown")
        measure(["data.prepare", "--dataset=taobao", f"--input={early}", f"--output_dir={grown}", *protocol])
        before = DatasetSpec.load(grown)
        copy = shutil.copytree(grown, os.path.join(work, "in_process"))
        append_s, append_mib = measure(["data.prepare", "--append", f"--input={day}", f"--output_dir={grown}"])
        after = DatasetSpec.load(grown)
        full_s, full_mib = measure(["data.prepare", "--dataset=taobao", f"--input={log}",
                                    f"--output_dir={os.path.join(work, 'whole')}", *protocol])
        rewritten = [k for k in range(args.partitions) if after.store[k] != before.store[k]]
        read = sum(int(before.files[before.store[k]]["clicks"]) for k in rewritten)
        active = _active_past_clicks(copy, day)
        import tensorflow  # noqa: F401  (imported before the phases are timed)
        from dare_tf.data.preparation.append import append

        phases = {}
        append(day, copy, timings=phases)
        rows = [{"days": args.days, "log_rows": log_rows, "day_rows": day_rows, "must_read": day_rows + active,
                 "partitions": args.partitions, "partitions_rewritten": len(rewritten), "store_clicks_read": read,
                 "prepare_all_s": round(full_s, 2), "append_day_s": round(append_s, 2),
                 "append/prepare": round(append_s / full_s, 3), "prepare_peak_mib": round(full_mib),
                 "append_peak_mib": round(append_mib),
                 **{f"in_process_{k}_s": round(v, 2) for k, v in phases.items()}}]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, list(rows[0]))
    write_parts("bench_append", {"append": rows}, ["append"], args.json)


if __name__ == "__main__":
    main()
