"""The day-by-day loop (examples/daily_loop.py) on a generated log of several days:
per day, the seconds to prepare the first days or append the day, train (the first day from scratch,
then continued from the previous day's run for a fixed number of steps), export the
next version and have the stand-in server switch to it, measured in process (the
server in this process); and, beside each continued day, a full retrain on the same
days (one epoch from scratch): its steps and test AUC against the continued run's.

Usage: python benchmarks/bench_daily.py [--days 5] [--users 600] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_parts  # noqa: E402
from examples import daily_loop  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--users", type=int, default=600)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from dare_tf.training import TrainConfig, train

    work = tempfile.mkdtemp(prefix="bench_daily_")

    def retrain(data_dir, row):  # on the same days, before the next is appended
        if row["continued"]:
            start = time.perf_counter()
            result = train(data_dir, os.path.join(work, f"day_{row['day']}", "retrain"),
                           TrainConfig.create(**daily_loop.TRAINING))
            row.update(retrain_steps=result["per_seed"][0]["steps"], retrain_test_auc=round(result["test"]["auc"], 4),
                       retrain_s=round(time.perf_counter() - start, 1))

    try:
        rows = daily_loop.main(args.days, work, args.users, on_day=retrain)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, list(rows[-1]))
    write_parts("bench_daily", {"loop": rows}, ["loop"], args.json)


if __name__ == "__main__":
    main()
