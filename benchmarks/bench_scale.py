"""The paper's logs at their real size, phase by phase (issue: Taobao's 100M rows,
Tmall's 55M): each phase's wall seconds, peak RSS, bytes written and rate, beside
the same phase on a 1M-row log of the same kind (how the cost grows with size).

Measured so far: `generate` (`python -m data.synthetic --like=taobao|tmall`, each
run in its own process). The later phases (prepare, train, evaluate, export, the
history service, retrieval, recommend) are not measured yet: docs/scale.md lists
them.

Usage: python benchmarks/bench_scale.py [--fraction 1.0] [--logs taobao,tmall] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.bench_prepare import measure  # noqa: E402
from benchmarks.common import print_table, write_parts  # noqa: E402

SMALL_ROWS = 1_000_000
# The target for a log of either real size, in seconds on this 2-core machine.
GENERATE_TARGET_S = 300


def generate(like: str, fraction: float, work: str) -> dict:
    from dare_tf.data.lifelike import LIKE

    out = os.path.join(work, f"{like}-{fraction:g}.csv")
    seconds, peak_mib = measure(["data.synthetic", f"--like={like}", f"--fraction={fraction}", f"--output={out}"])
    rows = LIKE[like].rows if fraction == 1 else LIKE[like].scaled(fraction).rows
    written = os.path.getsize(out)
    with open(out + ".truth.json") as f:
        auc = json.load(f)["generator_auc"]
    os.remove(out)
    return {"log": like, "fraction": round(fraction, 6), "rows": rows, "seconds": round(seconds, 1),
            "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak_mib), "mb_written": round(written / 1e6),
            "generator_auc": round(auc, 4)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=1.0, help="of the real size (the tables: 1.0)")
    parser.add_argument("--logs", default="taobao,tmall")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from dare_tf.data.lifelike import LIKE

    rows = []
    work = tempfile.mkdtemp(prefix="bench_scale_")
    for like in args.logs.split(","):
        small = generate(like, SMALL_ROWS / LIKE[like].rows, work)
        large = generate(like, args.fraction, work)
        for row in (small, large):
            row["rate/1M-row rate"] = round(row["rows_per_s"] / small["rows_per_s"], 2)
        full = args.fraction == 1
        large["target_s"] = GENERATE_TARGET_S if full else None
        large["seconds/target"] = round(large["seconds"] / GENERATE_TARGET_S, 2) if full else None
        rows += [small, large]
    shutil.rmtree(work)
    print(print_table(rows, list(rows[0])))
    write_parts("bench_scale", {"generate": rows}, ["generate"], args.json)


if __name__ == "__main__":
    main()
