"""Speed, peak memory and output size of data.prepare against the pure-Python
reference algorithm and against the per-example layout of an earlier commit.

Usage: python benchmarks/bench_prepare.py [--rows 1000000,4000000] [--baseline_ref eae56aa]
           [--json PATH]

Generates Taobao-format logs with data.synthetic (about the requested rows),
then runs `python -m data.prepare` (the sequence store), the same program at
`--baseline_ref` (the last commit that wrote every example's L=200 history,
in a git worktree; also at L=50, to fit its size per history slot) and
`benchmarks/reference_prepare.py` on each, every run in its own process,
and reports rows/s, peak RSS and the size of what each wrote. The
per-example layout at L=10,000 is extrapolated from its sizes at L=50 and
L=200 (it would not fit this disk at 4M rows); the store does not depend
on L.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402

# Runs a command and prints its own peak RSS (KiB) and its largest child process's as the last line.
PEAK = ("import resource, runpy, sys; sys.argv = sys.argv[1:]; "
        "exec('try:\\n runpy.run_module(sys.argv[0], run_name=\"__main__\") if not sys.argv[0].endswith(\".py\") '"
        "'else runpy.run_path(sys.argv[0], run_name=\"__main__\")\\nexcept SystemExit: pass'); "
        "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def measure(argv: list[str]) -> tuple[float, float]:
    return measure_in(REPO, argv)


def measure_in(root: str, argv: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of `argv` run with `root` as the repository."""
    seconds, peak, _ = measure_with_children(root, argv)
    return seconds, peak


def measure_with_children(root: str, argv: list[str]) -> tuple[float, float, float]:
    """`measure_in`, and the peak RSS (MiB) of the largest process `argv` started and waited for."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PEAK, *argv], cwd=root, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=root))
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{out.stderr[-3000:]}")
    peak = [line for line in out.stdout.splitlines() if line.startswith("PEAK_KIB")][-1].split()
    return seconds, int(peak[1]) / 1024, int(peak[2]) / 1024


def size_mb(directory: str) -> float:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)) / 1e6


def baseline_tree(ref: str) -> str:
    tree = tempfile.mkdtemp(prefix="dare_prepare_baseline_")
    subprocess.run(["git", "worktree", "add", "--detach", "-f", tree, ref], cwd=REPO, check=True, capture_output=True)
    return tree


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,4000000", help="comma-separated log sizes")
    parser.add_argument("--baseline_ref", default="eae56aa", help="commit of the per-example layout ('' to skip)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--workdir", default=None, help="where logs and outputs go (default: a temp dir)")
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="bench_prepare_")
    rows, sizes = [], []
    tree = baseline_tree(args.baseline_ref) if args.baseline_ref else None
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
        ours_dir = os.path.join(work, f"ours_{target}")
        ours = measure(["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={ours_dir}"])
        ref_dir = os.path.join(work, f"ref_{target}")
        ref = measure([os.path.join(REPO, "benchmarks", "reference_prepare.py"), log, ref_dir])
        runs = [("data.prepare (store)", ours, size_mb(ours_dir)), ("reference (pure Python)", ref, size_mb(ref_dir))]
        sizes.append({"rows": n_rows, "layout": "sequence store (any L)", "L": "any", "mb": size_mb(ours_dir)})
        if tree:
            per_len = {}
            for length in (50, 200):
                old_dir = os.path.join(work, f"old_{target}_{length}")
                old = measure_in(tree, ["data.prepare", "--dataset=taobao", f"--input={log}",
                                        f"--output_dir={old_dir}", f"--max_len={length}"])
                per_len[length] = size_mb(old_dir)
                if length == 200:
                    runs.append((f"per-example layout ({args.baseline_ref})", old, per_len[length]))
                shutil.rmtree(old_dir)
            slope = (per_len[200] - per_len[50]) / 150
            for length in (200, 10_000):
                sizes.append({"rows": n_rows, "layout": f"per-example ({args.baseline_ref})", "L": length,
                              "mb": per_len[50] + slope * (length - 50),
                              "measured": length == 200})
        for name, (sec, mib), mb in runs:
            rows.append({"rows": n_rows, "program": name, "seconds": sec, "rows_per_s": n_rows / sec,
                         "peak_rss_mib": mib, "output_mb": mb})
        rows.append({"rows": n_rows, "program": "ours / reference", "seconds": ours[0] / ref[0],
                     "rows_per_s": ref[0] / ours[0], "peak_rss_mib": ours[1] / ref[1]})
        shutil.rmtree(ref_dir, ignore_errors=True)
        print_table(rows, ["rows", "program", "seconds", "rows_per_s", "peak_rss_mib", "output_mb"])
        print_table(sizes, ["rows", "layout", "L", "mb", "measured"])
    if tree:
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, capture_output=True)
    print("ratio row: rows_per_s = speed-up, peak_rss_mib = ours / reference; per-example L=10,000 sizes are "
          "extrapolated from L=50 and L=200")
    write_json("bench_prepare", {"results": rows, "sizes": sizes, "workdir": work}, args.json)


if __name__ == "__main__":
    main()
