"""The paper's logs at their real size, phase by phase (issue: Taobao's 100M rows,
Tmall's 55M): each phase's wall seconds, peak RSS, bytes written and rate, beside
the same phase on a 1M-row log of the same kind (how the cost grows with size).

Measured so far, each run in its own process: `generate` (`python -m
data.synthetic --like=taobao|tmall`) and `prepare` (`python -m data.prepare`, the
in-memory driver, Tmall with `--fields=seller,brand`). The later phases (Beam,
train, evaluate, export, the history service, retrieval, recommend) are not
measured yet: docs/scale.md lists them.

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
# The targets on this 2-core machine, in seconds: a log of either real size generated,
# and the full Taobao log prepared (at no more than 12 GB peak).
GENERATE_TARGET_S, PREPARE_TARGET_S = 300, 1200


def generate(like: str, fraction: float, work: str) -> tuple[dict, str]:
    """The `generate` row of a log like `like`, and the log's path (kept for `prepare`)."""
    from dare_tf.data.lifelike import LIKE

    out = os.path.join(work, f"{like}-{fraction:g}.csv")
    seconds, peak_mib = measure(["data.synthetic", f"--like={like}", f"--fraction={fraction}", f"--output={out}"])
    rows = LIKE[like].rows if fraction == 1 else LIKE[like].scaled(fraction).rows
    with open(out + ".truth.json") as f:
        auc = json.load(f)["generator_auc"]
    return {"log": like, "fraction": round(fraction, 6), "rows": rows, "seconds": round(seconds, 1),
            "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak_mib),
            "mb_written": round(os.path.getsize(out) / 1e6), "generator_auc": round(auc, 4)}, out


def prepare(like: str, log: str, row: dict) -> dict:
    """`data.prepare` (the in-memory driver, its default protocol) of a generated log:
    Tmall's with its sellers and brands as fields."""
    from dare_tf.data.spec import DatasetSpec

    out = log + ".prepared"
    fields = ["--fields=seller,brand"] if like == "tmall" else []
    seconds, peak_mib = measure(["data.prepare", f"--dataset={like}", f"--input={log}", f"--output_dir={out}",
                                 *fields])
    spec = DatasetSpec.load(out)
    written = sum(os.path.getsize(os.path.join(out, name)) for name in os.listdir(out))
    shutil.rmtree(out)
    return {"log": like, "fraction": row["fraction"], "rows": row["rows"], "seconds": round(seconds, 1),
            "rows_per_s": round(row["rows"] / seconds), "peak_rss_mib": round(peak_mib),
            "mb_written": round(written / 1e6), "users": spec.users, "examples": sum(spec.counts.values())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=1.0, help="of the real size (the tables: 1.0)")
    parser.add_argument("--logs", default="taobao,tmall")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from dare_tf.data.lifelike import LIKE

    parts = {"generate": [], "prepare": []}
    work = tempfile.mkdtemp(prefix="bench_scale_")
    full = args.fraction == 1
    for like in args.logs.split(","):
        for fraction in (SMALL_ROWS / LIKE[like].rows, args.fraction):
            made, log = generate(like, fraction, work)
            parts["generate"].append(made)
            parts["prepare"].append(prepare(like, log, made))
            os.remove(log)
        for phase, target_s in (("generate", GENERATE_TARGET_S), ("prepare", PREPARE_TARGET_S)):
            small, large = parts[phase][-2:]
            for row in (small, large):
                row["rate/1M-row rate"] = round(row["rows_per_s"] / small["rows_per_s"], 2)
            large["target_s"] = target_s if full else None
            large["seconds/target"] = round(large["seconds"] / target_s, 2) if full else None
    shutil.rmtree(work)
    for phase, rows in parts.items():
        print(phase)
        print_table(rows, list(rows[-1]))
    write_parts("bench_scale", parts, list(parts), args.json)


if __name__ == "__main__":
    main()
