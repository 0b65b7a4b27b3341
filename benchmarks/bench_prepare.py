"""Speed and peak memory of data.prepare against the pure-Python reference algorithm.

Usage: python benchmarks/bench_prepare.py [--rows 1000000,10000000] [--json PATH]

Generates Taobao-format logs with data.synthetic (about the requested rows),
then runs `python -m data.prepare` and `benchmarks/reference_prepare.py` on
each, every run in its own process, and reports rows/s and peak RSS.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402

# Runs a command and prints its own peak RSS (KiB) as the last line.
PEAK = ("import resource, runpy, sys; sys.argv = sys.argv[1:]; "
        "exec('try:\\n runpy.run_module(sys.argv[0], run_name=\"__main__\") if not sys.argv[0].endswith(\".py\") '"
        "'else runpy.run_path(sys.argv[0], run_name=\"__main__\")\\nexcept SystemExit: pass'); "
        "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")


def measure(argv: list[str]) -> tuple[float, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PEAK, *argv], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{out.stderr[-3000:]}")
    peak = [line for line in out.stdout.splitlines() if line.startswith("PEAK_KIB")][-1]
    return seconds, int(peak.split()[1]) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated log sizes")
    parser.add_argument("--json", default=None)
    parser.add_argument("--workdir", default=None, help="where logs and outputs go (default: a temp dir)")
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="bench_prepare_")
    rows = []
    for target in [int(r) for r in args.rows.split(",")]:
        log = os.path.join(work, f"log_{target}.csv")
        users = max(10, int(target / 1.1 / 275))  # ~275 clicks per user plus 10% other events
        if not os.path.exists(log):
            subprocess.run([sys.executable, "-m", "data.synthetic", f"--output={log}", f"--users={users}",
                            "--items=1000000", "--categories=5000", "--min_length=150", "--max_length=400",
                            "--length_median=275", "--length_sigma=0.3"], cwd=REPO, check=True,
                           capture_output=True)
        with open(log, "rb") as f:
            n_rows = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        ours = measure(["data.prepare", "--dataset=taobao", f"--input={log}",
                        f"--output_dir={os.path.join(work, f'ours_{target}')}"])
        ref = measure([os.path.join(REPO, "benchmarks", "reference_prepare.py"), log,
                       os.path.join(work, f"ref_{target}")])
        for name, (sec, mib) in (("data.prepare", ours), ("reference (pure Python)", ref)):
            rows.append({"rows": n_rows, "program": name, "seconds": sec, "rows_per_s": n_rows / sec,
                         "peak_rss_mib": mib})
        rows.append({"rows": n_rows, "program": "ratio", "seconds": ref[0] / ours[0],
                     "rows_per_s": ref[0] / ours[0], "peak_rss_mib": ours[1] / ref[1]})
        print_table(rows, ["rows", "program", "seconds", "rows_per_s", "peak_rss_mib"])
    print("ratio row: rows_per_s = speed-up (target >= 5), peak_rss_mib = ours / reference (target <= 0.33)")
    write_json("bench_prepare", {"results": rows, "workdir": work}, args.json)


if __name__ == "__main__":
    main()
