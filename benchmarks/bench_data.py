"""The data path on TFRecord files: preparation, the trainer's input streamed and
cached against the previous commit, and memory per worker.

Usage: python benchmarks/bench_data.py [--parts prepare,train,checks,workers,load] [--rows 1000000,4000000]
           [--baseline_ref REF] [--load_ref REF] [--rounds 2] [--json PATH]

prepare: `python -m data.prepare` (GZIP, and --compression=none) and the same
  program at `--baseline_ref` (the `.npz` layout) on generated Taobao-format
  logs of about `--rows` rows, each in its own process: seconds, peak RSS,
  bytes written and their ratio to the raw CSV's bytes.
train: `dare_tf.training.train` on the 1M-row log of `bench_train.py --parts
  end_to_end` (3,000 users, 50k items; DARE, d=16, batch 256,
  2 epochs, Adam, a validation every 300 steps), each run in its own
  process, alternating, `--rounds` rounds: streamed from the TFRecord shards
  (`in_memory_mb=0`), cached (the default: the split's columns in memory),
  and the baseline commit's trainer (its default, in memory) on its own
  preparation of the same log; each round starts with the next variant. Trainer samples/s = steps x batch / training
  seconds (validations excluded); medians and ratios to the baseline.
checks: what reading checks cost on the train part's dataset, per pass over all
  shards: size and sha256 of every file, the parse itself (tf.data and
  tf.io.parse_example into numpy), and the vectorised id-range checks; against
  the time of one training epoch at the streamed rate.
workers: peak RSS of each process training 200 steps on the 1M-row log with
  1 process and with 2 local `multi_worker` processes (TF_CONFIG on
  localhost), and the store bytes each loads (its partitions' clicks).
load: what a training run reads before its first step, the three splits'
  columns (`InMemorySplit.load`) and the store (`SequenceStore.load`), checked,
  in a fresh process (first) and again in it, at this commit and at
  `--load_ref` (the last commit that read shard by shard), alternating,
  `--rounds` rounds, on the prepared Taobao sample (16 partitions of a few
  hundred records) and the train part's 1M-row dataset: median seconds and
  the previous commit's time over this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.bench_prepare import baseline_tree, measure_in, size_mb  # noqa: E402
from benchmarks.common import print_table, selected_parts, write_parts  # noqa: E402
from dare_tf.testing.ports import free_port  # noqa: E402

BASELINE_REF = "e6149c4"  # the last commit of the .npz layout
LOAD_REF = "d4e0e0a"  # the last commit that read (and traced a tf.data function for) each shard on its own
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

# Runs in any checkout (argv: repo data_dir run_dir in_memory_mb strategy max_steps log):
# prepares the log there if needed, trains, prints one JSON line.
TRAIN_SCRIPT = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
repo, data_dir, run_dir, in_memory_mb, strategy, max_steps, log = sys.argv[1:8]
from dare_tf import training
from dare_tf.data.preparation.in_memory import prepare
if not os.path.exists(os.path.join(data_dir, "spec.json")):
    prepare("taobao", log, data_dir)
make_config = getattr(training.TrainConfig, "create", training.TrainConfig)  # (a baseline commit: flat)
config = make_config(preset="dare", optimizer="adam", batch_size=256, eval_batch_size=8192, epochs=2,
                              eval_every=300, verbose=0, model_overrides=dict(embedding_dim=16),
                              in_memory_mb=int(in_memory_mb), strategy=strategy,
                              max_steps=int(max_steps) if int(max_steps) else None)
start = time.perf_counter()
results = training.train(data_dir, run_dir, config)
wall = time.perf_counter() - start
history = training.read_history(os.path.join(run_dir, "seed_0"))
steps, timing = history[-1]["step"], history[-1]["timing"]
store_bytes = 0
try:
    from dare_tf.data.storage import store
    store_bytes = sum(s.nbytes for s in store._CACHE.values())
except Exception:
    pass
print("RESULT", json.dumps({"steps": steps, "train_samples_per_s": steps * 256 / timing["train_seconds"],
                            "wall_s": wall, "test_auc": results["test"]["auc"], "store_mb": store_bytes / 1e6,
                            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


# Runs in any checkout (argv: repo data_dir): loads what a training run loads, twice, and
# prints one JSON line with the seconds of each.
LOAD_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import tensorflow  # noqa: F401  (started before the clock)
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.store import SequenceStore
spec = DatasetSpec.load(sys.argv[2])
seconds = []
for _ in range(2):
    start = time.perf_counter()
    for split in ("train", "val", "test"):
        InMemorySplit.load(sys.argv[2], split, spec)
    SequenceStore.load(sys.argv[2], spec)
    seconds.append(time.perf_counter() - start)
print("RESULT", json.dumps({"first_s": seconds[0], "again_s": seconds[1]}))
"""


def bench_load(work: str, ref: str, rounds: int) -> list[dict]:
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.storage.spec import DatasetSpec

    sample = os.path.join(work, "taobao_sample")
    if not os.path.exists(os.path.join(sample, "spec.json")):
        prepare("taobao", os.path.join(os.path.dirname(REPO), "shared", "data", "taobao", "UserBehavior_sample.csv"),
                sample)
    e2e = os.path.join(work, "data_e2e")
    if not os.path.exists(os.path.join(e2e, "spec.json")):
        subprocess.run([sys.executable, "-m", "data.prepare", "--dataset=taobao", f"--input={end_to_end_log(work)}",
                        f"--output_dir={e2e}"], cwd=REPO, check=True, capture_output=True, env=ENV)
    tree = baseline_tree(ref)
    try:
        variants = [("this commit", REPO), (f"previous commit ({ref})", tree)]
        rows = []
        for name, data_dir in (("Taobao sample", sample), ("1M-row log", e2e)):
            runs: dict[str, list[dict]] = {v: [] for v, _ in variants}
            for r in range(rounds):
                for variant, root in variants[r % 2:] + variants[:r % 2]:
                    done = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, root, data_dir], cwd=root, env=ENV,
                                          capture_output=True, text=True, check=True)
                    runs[variant].append(json.loads(done.stdout.split("RESULT ")[-1]))
            spec = DatasetSpec.load(data_dir)
            base = {k: statistics.median(x[k] for x in runs[variants[1][0]]) for k in ("first_s", "again_s")}
            for variant, _ in variants:
                first, again = (statistics.median(x[k] for x in runs[variant]) for k in ("first_s", "again_s"))
                rows.append({"dataset": name, "examples": sum(spec.counts.values()),
                             "shards": sum(len(v) for v in spec.shards.values()) + len(spec.store), "code": variant,
                             "first_s": first, "again_s": again, "previous/this (first)": base["first_s"] / first,
                             "previous/this (again)": base["again_s"] / again})
                print(f"  {rows[-1]}", flush=True)
        return rows
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, capture_output=True)


def generate_log(work: str, target: int) -> tuple[str, int]:
    log = os.path.join(work, f"log_{target}.csv")
    users = max(10, int(target / 1.1 / 275))  # ~275 clicks per user plus 10% other events
    if not os.path.exists(log):
        subprocess.run([sys.executable, "-m", "data.synthetic", f"--output={log}", f"--users={users}",
                        "--items=1000000", "--categories=5000", "--min_length=150", "--max_length=400",
                        "--length_median=275", "--length_sigma=0.3"], cwd=REPO, check=True, capture_output=True)
    with open(log, "rb") as f:
        rows = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    return log, rows


def bench_prepare(work: str, targets: list[int], tree: str | None, ref: str) -> list[dict]:
    rows = []
    for target in targets:
        log, n_rows = generate_log(work, target)
        csv_mb = os.path.getsize(log) / 1e6
        runs = [("TFRecord, GZIP", REPO, []), ("TFRecord, uncompressed", REPO, ["--compression=none"])]
        if tree:
            runs.append((f".npz ({ref})", tree, []))
        for name, root, extra in runs:
            out = os.path.join(work, f"prep_{target}_{len(rows)}")
            seconds, mib = measure_in(root, ["data.prepare", "--dataset=taobao", f"--input={log}",
                                             f"--output_dir={out}", *extra])
            mb = size_mb(out)
            rows.append({"rows": n_rows, "layout": name, "seconds": seconds, "rows_per_s": n_rows / seconds,
                         "peak_rss_mib": mib, "output_mb": mb, "output/csv": mb / csv_mb, "csv_mb": csv_mb})
            print(f"  {rows[-1]}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    return rows


def _train(root: str, data_dir: str, run_dir: str, in_memory_mb: int, log: str, strategy: str = "default",
           max_steps: int = 0, env=None, clean: bool = True) -> subprocess.Popen:
    if clean:
        shutil.rmtree(run_dir, ignore_errors=True)
    return subprocess.Popen([sys.executable, "-c", TRAIN_SCRIPT, root, data_dir, run_dir, str(in_memory_mb), strategy,
                             str(max_steps), log], cwd=root, env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"training failed:\n{err[-3000:]}")
    return json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])


def end_to_end_log(work: str) -> str:
    """The 1M-row log of `bench_train.py --parts end_to_end` (3,000 users, 50k items)."""
    from dare_tf.data.generation.synthetic import SyntheticConfig, write

    log = os.path.join(work, "log_end_to_end.csv")
    if not os.path.exists(log):
        write(SyntheticConfig(users=3000, items=50_000, categories=1_000, min_length=300, max_length=366,
                              length_median=333, length_sigma=0.05, seed=0), log)
    return log


def bench_train(work: str, tree: str | None, ref: str, rounds: int) -> list[dict]:
    log = end_to_end_log(work)
    variants = [("streamed", REPO, os.path.join(work, "data_e2e"), 0),
                ("cached", REPO, os.path.join(work, "data_e2e"), 4096)]
    if tree:
        variants.append((f"previous commit ({ref}), cached", tree, os.path.join(work, "data_e2e_baseline"), 4096))
    runs: dict[str, list[dict]] = {name: [] for name, *_ in variants}
    for r in range(rounds):  # each round starts with another variant (this machine's load drifts)
        for name, root, data_dir, mb in variants[r % len(variants):] + variants[:r % len(variants)]:
            runs[name].append(_result(_train(root, data_dir, os.path.join(work, "run"), mb, log)))
            print(f"  round {r} {name}: {runs[name][-1]}", flush=True)
    base = statistics.median(x["train_samples_per_s"] for x in runs[variants[-1][0]])
    rows = []
    for name, *_ in variants:
        rate = statistics.median(x["train_samples_per_s"] for x in runs[name])
        rows.append({"input": name, "train_samples_per_s": rate, "vs_previous": rate / base,
                     "rounds": [round(x["train_samples_per_s"]) for x in runs[name]],
                     "steps": runs[name][0]["steps"], "test_auc": runs[name][0]["test_auc"],
                     "peak_rss_mb": max(x["peak_rss_mb"] for x in runs[name])})
    return rows


def bench_checks(work: str, train_rows: list[dict] | None) -> list[dict]:
    import time

    log = end_to_end_log(work)
    data_dir = os.path.join(work, "data_e2e")  # the train part's dataset
    if not os.path.exists(os.path.join(data_dir, "spec.json")):
        subprocess.run([sys.executable, "-m", "data.prepare", "--dataset=taobao", f"--input={log}",
                        f"--output_dir={data_dir}"], cwd=REPO, check=True, capture_output=True, env=ENV)
    from dare_tf.data.storage import records
    from dare_tf.data.storage.spec import DatasetSpec

    spec = DatasetSpec.load(data_dir)
    names = [n for s in ("train", "val", "test") for n in spec.shards[s]] + spec.store
    examples = sum(spec.counts.values())
    start = time.perf_counter()
    for name in names:
        records.check_file(data_dir, name, spec)
    files_s = time.perf_counter() - start
    original = records.check_ids
    checking = [0.0]

    def timed(*args):
        t0 = time.perf_counter()
        original(*args)
        checking[0] += time.perf_counter() - t0
    records.check_ids = timed
    start = time.perf_counter()
    for name in names:
        records.read_shard(data_dir, name, spec, "store" if name.startswith("store") else name.split("-")[0])
    read_s = time.perf_counter() - start
    records.check_ids = original
    epoch_s = None
    streamed = [r for r in train_rows or [] if r["input"] == "streamed"]
    if streamed:
        epoch_s = spec.counts["train"] / streamed[0]["train_samples_per_s"]
    rows = [{"what": "size and sha256 of every shard", "seconds": files_s},
            {"what": "parse every shard (the package's numpy decoder) and check its ids", "seconds": read_s - files_s},
            {"what": "of which the id-range checks", "seconds": checking[0]}]
    for r in rows:
        r["us_per_record"] = r["seconds"] / examples * 1e6
        if epoch_s:
            r["of_a_streamed_epoch"] = r["seconds"] / epoch_s
    return rows


def bench_workers(work: str) -> list[dict]:
    log, _ = generate_log(work, 1_000_000)
    data_dir = os.path.join(work, "data_1m")
    rows = []
    one = _result(_train(REPO, data_dir, os.path.join(work, "w1"), 4096, log, max_steps=200))
    rows.append({"workers": 1, "worker": 0, "peak_rss_mb": one["peak_rss_mb"], "store_mb": one["store_mb"],
                 "steps": one["steps"]})
    ports = [free_port(), free_port()]
    procs = []
    shutil.rmtree(os.path.join(work, "w2"), ignore_errors=True)
    for index in (0, 1):
        tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}}
        procs.append(_train(REPO, data_dir, os.path.join(work, "w2"), 4096, log, "multi_worker", 200,
                            dict(ENV, TF_CONFIG=json.dumps(tf_config)), clean=False))
    for index, proc in enumerate(procs):
        result = _result(proc)
        rows.append({"workers": 2, "worker": index, "peak_rss_mb": result["peak_rss_mb"],
                     "store_mb": result["store_mb"], "steps": result["steps"]})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="prepare,train,checks,workers")
    parser.add_argument("--rows", default="1000000,4000000", help="prepare: comma-separated log sizes")
    parser.add_argument("--baseline_ref", default=BASELINE_REF, help="the commit to compare with ('' to skip)")
    parser.add_argument("--load_ref", default=LOAD_REF, help="load: the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="train, load: alternating rounds")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "dare_bench_data"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = selected_parts(parser, args.parts, ("prepare", "train", "checks", "workers", "load"))
    os.makedirs(args.work_dir, exist_ok=True)
    tree = baseline_tree(args.baseline_ref) if args.baseline_ref and parts & {"prepare", "train"} else None
    payload = {"baseline_ref": args.baseline_ref}
    try:
        if "prepare" in parts:
            print("prepare: data.prepare on generated Taobao-format logs")
            payload["prepare"] = bench_prepare(args.work_dir, [int(r) for r in args.rows.split(",")], tree,
                                               args.baseline_ref)
            print_table(payload["prepare"], ["rows", "layout", "seconds", "rows_per_s", "peak_rss_mib", "output_mb",
                                             "output/csv"])
        if "train" in parts:
            print("train: trainer samples/s on the 1M-row log (DARE d=16, batch 256, 2 epochs, Adam)")
            payload["train"] = bench_train(args.work_dir, tree, args.baseline_ref, args.rounds)
            print_table(payload["train"], ["input", "train_samples_per_s", "vs_previous", "rounds", "steps",
                                           "test_auc", "peak_rss_mb"])
        if "checks" in parts:
            print("checks: one pass of the read checks over the 1M-row dataset's shards")
            payload["checks"] = bench_checks(args.work_dir, payload.get("train"))
            print_table(payload["checks"], ["what", "seconds", "us_per_record", "of_a_streamed_epoch"])
        if "workers" in parts:
            print("workers: peak RSS per process, 200 steps on the 1M-row log")
            payload["workers"] = bench_workers(args.work_dir)
            print_table(payload["workers"], ["workers", "worker", "peak_rss_mb", "store_mb", "steps"])
        if "load" in parts:
            print("load: the splits and the store a training run reads, this commit against the previous")
            payload["load"] = bench_load(args.work_dir, args.load_ref, args.rounds)
            print_table(payload["load"], list(payload["load"][0]))
    finally:
        if tree:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, capture_output=True)
    write_parts("bench_data", payload, parts, args.json)


if __name__ == "__main__":
    main()
