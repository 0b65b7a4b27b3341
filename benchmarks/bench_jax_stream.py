r"""The trainer on JAX with its splits streamed from the shards (`--in_memory_mb=0`,
`dare_tf.data.feeding.shard_stream`, each call's examples placed by a background
thread) against the same run holding them in memory, in the same run of this
program: training examples/s, the streamed rate's ratio to the in-memory one, and
each process's peak resident memory.

  python benchmarks/bench_jax_stream.py [--users 3000] [--rounds 2] [--json PATH]

A generated Taobao-format log (`--users` users of ~275 clicks), prepared; then
rounds of two `trainers.train` processes (KERAS_BACKEND=jax, DARE, batch 512,
`--max_steps`), alternating. The rate is the training steps' examples over their
seconds (history.jsonl's `train_seconds`) after the first validation, so the
first call's compile is left out. The median of the rounds is kept. docs/gpu.md's
table is generated from results/bench_jax_stream.json (benchmarks/tables.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402

BATCH, STEPS, EVAL_EVERY = 512, 200, 50
MODES = {"in memory": "--in_memory_mb=100000", "streamed": "--in_memory_mb=0"}
# The trainer in this process, then its peak resident set (a run's own, not its parent's).
RUN = ("import resource, runpy, sys\nsys.argv = ['trainers.train', *sys.argv[1:]]\n"
       "try:\n    runpy.run_module('trainers.train', run_name='__main__', alter_sys=True)\n"
       "except SystemExit as e:\n    assert not e.code, e.code\n"
       "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")


def prepared(work: str, users: int) -> tuple[str, int]:
    log, data_dir = os.path.join(work, "log.csv"), os.path.join(work, "prepared")
    steps = [["data.synthetic", f"--output={log}", f"--users={users}", "--items=1000000", "--categories=5000",
              "--min_length=150", "--max_length=400", "--length_median=275", "--length_sigma=0.3"],
             ["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={data_dir}"]]
    for args in [] if os.path.exists(os.path.join(data_dir, "spec.json")) else steps:
        subprocess.run([sys.executable, "-m", *args], cwd=REPO, check=True, capture_output=True)
    with open(os.path.join(data_dir, "spec.json")) as f:
        return data_dir, json.load(f)["counts"]["train"]


def run(data_dir: str, out: str, flag: str) -> dict:
    args = [f"--data_dir={data_dir}", f"--output_dir={out}", "--model=dare", f"--batch_size={BATCH}",
            f"--max_steps={STEPS}", f"--eval_every={EVAL_EVERY}", "--epochs=1", "--seeds=0", "--verbose=0",
            "--compilation_cache=none", flag]
    done = subprocess.run([sys.executable, "-c", RUN, *args], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS",
                                                                                                 "cpu")))
    if done.returncode:
        raise SystemExit(f"{flag}: {done.stderr[-2000:]}")
    history = [json.loads(line) for line in open(os.path.join(out, "seed_0", "history.jsonl"))]
    first, last = history[0], history[-1]
    seconds = last["timing"]["train_seconds"] - first["timing"]["train_seconds"]
    rss = int(done.stdout.strip().splitlines()[-1].split()[1]) / 1024
    return {"examples_per_s": (last["step"] - first["step"]) * BATCH / seconds, "peak_rss_mb": rss,
            "test_auc": json.load(open(os.path.join(out, "results.json")))["test"]["auc"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_jax_stream-")
    data_dir, examples = prepared(work, args.users)  # (kept for the next run of this program in --work_dir)
    runs = tempfile.mkdtemp(prefix="runs-", dir=work)  # (this run's own: never a finished run read back)
    measured: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode, flag in MODES.items():
            measured[mode].append(run(data_dir, os.path.join(runs, f"{mode.replace(' ', '_')}_{round_}"), flag))
            print(mode, round_, measured[mode][-1], flush=True)
    base = statistics.median(r["examples_per_s"] for r in measured["in memory"])
    rows = [{"input": mode, "train_examples": examples, "batch": BATCH, "steps": STEPS,
             "examples_per_s": statistics.median(r["examples_per_s"] for r in runs),
             "vs_in_memory": statistics.median(r["examples_per_s"] for r in runs) / base,
             "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
             "rounds": len(runs)} for mode, runs in measured.items()]
    print_table(rows, ["input", "train_examples", "batch", "steps", "examples_per_s", "vs_in_memory", "peak_rss_mb",
                       "rounds"])
    import jax  # noqa: F401 (the device the runs used, named in the results)

    write_json("bench_jax_stream", {"rows": rows, "runs": measured, "device": jax.devices()[0].device_kind},
               args.json)


if __name__ == "__main__":
    main()
