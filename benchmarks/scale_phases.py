"""bench_scale's phases after preparation, each on one prepared dataset (the
1M-row log's or the real size's), each program in a process of its own:
`train` (DARE streamed, and its validation pass: `evaluate`), `input` (the
streamed input alone, benchmarks/scale_input.py), `export` (the trained run
with its full id maps, loaded and asked `rank`), `histories` (every user of
the raw log into LMDB and Redis), `retrieval` (the two-tower stage trained,
exported, and its top-200 exact and through faiss) and `recommend` (both
exports through the stand-in, 16 clients)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from benchmarks.bench_long import percentiles
from benchmarks.bench_prepare import measure
from benchmarks.common import REPO, rss_mb, start_standin

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
TRAIN_STEPS, BATCH, TOP_N, CANDIDATES, CALLS = 120, 2048, 200, 200, 200

TRAIN_SCRIPT = r"""
import json, resource, sys, time
data_dir, run_dir, optimizer, steps, batch, epochs = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
from dare_tf import training
config = training.TrainConfig.create(preset="dare", optimizer=optimizer, batch_size=batch, epochs=epochs,
                                     eval_every=steps, max_steps=steps, verbose=0, in_memory_mb=0,
                                     model_overrides=dict(embedding_dim=16))
start = time.perf_counter()
results = training.train(data_dir, run_dir, config)
history = training.read_history(run_dir + "/seed_0")
timing = history[-1]["timing"]
print("RESULT", json.dumps({"wall_s": time.perf_counter() - start, "steps": history[-1]["step"],
                            "train_seconds": timing["train_seconds"], "val_seconds": timing["val_seconds"],
                            "val_examples": timing["val_examples"], "test_auc": results["test"]["auc"],
                            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run_result(argv: list[str], prefix: list[str] | None = None) -> dict:
    """`python ARGV`'s `RESULT {json}` line (its output in the error if it fails)."""
    done = subprocess.run([*(prefix or []), sys.executable, *argv], cwd=REPO, env=ENV, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        what = argv[0] if argv[0] != "-c" else "a script"
        raise RuntimeError(f"{what} {argv[2:]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def train(data_dir: str, work: str, size: dict) -> list[dict]:
    """DARE (d=16, batch 2048) streamed from the shards (`in_memory_mb=0`) for
    TRAIN_STEPS steps with each optimizer, its validation pass timed (`evaluate`)."""
    from dare_tf.data.storage.spec import DatasetSpec

    spec, rows = DatasetSpec.load(data_dir), []
    for optimizer in ("adam", "lazy_adam"):
        run_dir = os.path.join(work, f"run_{optimizer}")
        shutil.rmtree(run_dir, ignore_errors=True)  # (an earlier run's)
        epochs = -(-TRAIN_STEPS * BATCH // spec.counts["train"])  # (enough for the steps, no more: each is drawn)
        r = _run_result(["-c", TRAIN_SCRIPT, data_dir, run_dir, optimizer, str(TRAIN_STEPS), str(BATCH), str(epochs)])
        rate = r["steps"] * BATCH / r["train_seconds"]
        rows.append({**size, "items": spec.num_items - 2, "optimizer": optimizer, "steps": r["steps"],
                     "samples_per_s": round(rate), "epoch_h": round(spec.counts["train"] / rate / 3600, 2),
                     "startup_s": round(r["wall_s"] - r["train_seconds"] - r["val_seconds"], 1),
                     "eval_per_s": round(r["val_examples"] / r["val_seconds"]),
                     "peak_rss_mib": round(r["peak_rss_mib"]), "test_auc": round(r["test_auc"], 4)})
        print(f"  {rows[-1]}", flush=True)
    return rows


def input_pipeline(data_dir: str, size: dict) -> list[dict]:
    """The streamed training input alone on one core (`taskset -c 0`) and on all."""
    rows = []
    for prefix in (["taskset", "-c", "0"], []):
        r = _run_result(["benchmarks/scale_input.py", data_dir, f"--batch={BATCH}"], prefix)
        rows.append({**size, **r, "per_core": round(r["pipeline_per_s"] / r["cpus"])})
        print(f"  {rows[-1]}", flush=True)
    return rows


RANK_SCRIPT = r"""
import json, resource, sys, time
import numpy as np
path, data_dir, n, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
from dare_tf.serving.recommender import LocalModel
model = LocalModel(path)
load_s = time.perf_counter() - start
from benchmarks.scale_phases import random_history
from dare_tf.serving.encoding import rank_tensors
rng = np.random.default_rng(0)
times = []
for call in range(calls + 3):
    hist_items, hist_categories, fields = random_history(data_dir, rng, 200)
    items, categories, candidates = random_history(data_dir, rng, n, "candidate")
    inputs = rank_tensors([hist_items], [hist_categories], [items], [categories], fields | candidates)
    t0 = time.perf_counter()
    model.predict_tensors(inputs, "rank")
    times.append(1000 * (time.perf_counter() - t0))
times = times[3:]
print("RESULT", json.dumps({"load_s": load_s, "rank_p50_ms": float(np.percentile(times, 50)),
                            "rank_p99_ms": float(np.percentile(times, 99)),
                            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


_RAW = {}


def random_history(data_dir: str, rng, length: int, role: str = "hist") -> tuple:
    """Random raw ids of a prepared dataset: `length` items, categories and each of its
    column fields' values (`{f"{role}_{name}": [values]}`, one row), for latency."""
    from dare_tf.data.storage.fields import field_id_file
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.id_maps import read_id_map
    from dare_tf.data.storage.schema import TIME_GAP

    if data_dir not in _RAW:
        names = [f["name"] for f in DatasetSpec.load(data_dir).fields if f["name"] != TIME_GAP]
        raw = {kind: np.array([int(r) for r in read_id_map(data_dir, kind)]) for kind in ("item", "category")}
        for name in names:
            with open(os.path.join(data_dir, field_id_file(name))) as f:
                raw[name] = np.array([int(r) for r in f.read().split()])
        _RAW[data_dir] = raw
    raw = _RAW[data_dir]
    pick = {kind: values[rng.integers(0, len(values), length)] for kind, values in raw.items()}
    return pick["item"], pick["category"], {f"{role}_{k}": [v] for k, v in pick.items()
                                            if k not in ("item", "category")}


def _size_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 1e6


def export(data_dir: str, work: str, size: dict) -> list[dict]:
    """`serving.export` of the `train` phase's Adam run, then (a fresh process) the
    SavedModel loaded and `rank` of one user's 200 behaviours against 200 candidates."""
    exports = os.path.join(work, "exports")
    shutil.rmtree(os.path.join(exports, "dare"), ignore_errors=True)  # (an earlier run's)
    seconds, peak = measure(["serving.export", f"--run_dir={os.path.join(work, 'run_adam')}",
                             f"--export_base={exports}", "--model_name=dare", "--version=1"])
    path = os.path.join(exports, "dare", "1")
    r = _run_result(["-c", RANK_SCRIPT, path, data_dir, str(CANDIDATES), str(CALLS)])
    row = {**size, "export_s": round(seconds, 1), "export_peak_rss_mib": round(peak), "mb_written": round(
        _size_mb(path)), "load_s": round(r["load_s"], 1), "rank_p50_ms": round(r["rank_p50_ms"], 2),
        "rank_p99_ms": round(r["rank_p99_ms"], 2), "served_rss_mib": round(r["peak_rss_mib"])}
    print(f"  {row}", flush=True)
    return [row]


def histories(log: str, like: str, work: str, size: dict) -> list[dict]:
    """Every user of the raw log appended to a new LMDB store and a Redis server
    (`serving.histories append`, its own process), then `last` of one user's
    200 clicks read in process."""
    from dare_tf.histories import open_store
    from dare_tf.testing.redis_server import RedisServer

    fields = ["--fields=seller,brand"] if like == "tmall" else []
    rows = []
    with RedisServer(work) as redis_url:
        shutil.rmtree(os.path.join(work, "histories"), ignore_errors=True)  # (an earlier run's)
        for url in (f"lmdb:{os.path.join(work, 'histories')}", redis_url):
            seconds, peak = measure(["serving.histories", "append", f"--store={url}", f"--input={log}",
                                     f"--dataset={like}", *fields])
            with open_store(url) as store:
                users = list(store.users())
                rng = np.random.default_rng(0)
                pick = [int(u) for u in rng.choice(users, CALLS + 1)]
                calls = iter(pick)
                p50, p99 = percentiles(lambda: store.last([next(calls)], 200), CALLS)
                stored = (os.path.getsize(os.path.join(work, "histories", "data.mdb")) if url.startswith("lmdb")
                          else store.client.info("memory")["used_memory"])
            rows.append({**size, "store": url.split(":")[0], "users": len(users), "seconds": round(seconds, 1),
                         "peak_rss_mib": round(peak), "mb_stored": round(stored / 1e6),
                         "last_p50_ms": round(p50, 3), "last_p99_ms": round(p99, 3)})
            print(f"  {rows[-1]}", flush=True)
    return rows


def load(data_dir: str, work: str, size: dict) -> list[dict]:
    """A prepared dataset's histories loaded into a new LMDB store (`serving.histories
    load`, its own process) at the lifelong default cap (`--max_clicks`, 10,000 per
    user): seconds, peak RSS, the store's size, the clicks it kept and the most of one
    user, then `last` of one user's 200 newest clicks read in process."""
    from dare_tf.histories import open_store

    store_dir = os.path.join(work, "loaded_histories")
    shutil.rmtree(store_dir, ignore_errors=True)  # (this phase's own, from an earlier run)
    seconds, peak = measure(["serving.histories", "load", f"--store=lmdb:{store_dir}", f"--data_dir={data_dir}"])
    with open_store(f"lmdb:{store_dir}") as store:
        users = list(store.users())
        sizes = np.array([store.size(u) for u in users])
        calls = itertools.cycle(int(u) for u in np.random.default_rng(0).choice(users, CALLS))
        p50, p99 = percentiles(lambda: store.last([next(calls)], 200), CALLS)
    row = {**size, "store": "lmdb", "users": len(users), "seconds": round(seconds, 1), "peak_rss_mib": round(peak),
           "mb_stored": round(os.path.getsize(os.path.join(store_dir, "data.mdb")) / 1e6),
           "clicks_kept": int(sizes.sum()), "most_clicks_of_a_user": int(sizes.max()),
           "last_p50_ms": round(p50, 3), "last_p99_ms": round(p99, 3)}
    print(f"  {row}", flush=True)
    return [row]


RETRIEVAL_SCRIPT = r"""
import json, resource, sys, time
data_dir, run_dir, export_base, top_n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from dare_tf.retrieval import use_keras2
use_keras2()
from dare_tf.retrieval import RetrievalConfig, train_retrieval
start = time.perf_counter()
train_retrieval(data_dir, run_dir, RetrievalConfig(epochs=1))
trained = time.perf_counter()
from dare_tf.export import export_run
export_run(run_dir, export_base, "retrieval", top_n=top_n)
import numpy as np
import tensorflow as tf
from dare_tf.retrieval.training import RetrievalStage
stage = RetrievalStage.load(data_dir, run_dir)
np.save(run_dir + "/candidate_vectors.npy", stage.model.candidate((tf.constant(stage.items),
                                                                   tf.constant(stage.categories))).numpy())
from dare_tf.retrieval.training import positives
test = positives(stage.splits["test"])  # the query tower's vectors of test histories
pick = np.random.default_rng(0).choice(len(test["target_item"]), min(1000, len(test["target_item"])), replace=False)
np.save(run_dir + "/query_vectors.npy", stage.model.query(
    {"hist_items": tf.constant(test["hist_items"][pick]),
     "hist_categories": tf.constant(test["hist_categories"][pick])}).numpy())
print("RESULT", json.dumps({"train_s": trained - start, "export_s": time.perf_counter() - trained,
                            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

TOP_SCRIPT = r"""
import json, sys, time
from dare_tf.retrieval import use_keras2
use_keras2()
import numpy as np
path, data_dir, calls, run_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.retrieval.index import ApproximateIndex, ExactIndex, exact_top_k, recall
from dare_tf.serving.recommender import LocalModel
model = LocalModel(path)
vectors = np.load(run_dir + "/candidate_vectors.npy")
items = np.array([int(r) for r in read_id_map(data_dir, "item")])
cats = np.array([int(r) for r in read_id_map(data_dir, "category")])
rng = np.random.default_rng(0)
def history():
    h = rng.integers(0, len(items), 200)
    return {"hist_items": items[h][None], "hist_categories": cats[h % len(cats)][None]}
def timed(fn, n):
    fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); out.append(1000 * (time.perf_counter() - t0))
    return float(np.percentile(out, 50)), float(np.percentile(out, 99))
served = timed(lambda: model.predict_tensors(history()), calls)
queries = np.load(run_dir + "/query_vectors.npy")
sample, queries = queries[:100], queries[100:]
q = iter(list(queries) * 2)
flat = ExactIndex(vectors)
exact = timed(lambda: flat.top_k(next(q)[None], 200), calls)
# What the export's exact retrieval costs a merged batch of 16 queries (its tower scores, then
# the two-tower source's top 400), per query: the matrix product and the top-k.
import tensorflow as tf
scores_of = tf.function(lambda x: tf.matmul(x, tf.constant(vectors), transpose_b=True))
batch = tf.constant(queries[:16])
scores = scores_of(batch)
from dare_tf.retrieval.candidates import blocked_top_k
top_of = tf.function(lambda s: tf.math.top_k(s, 400).indices)
blocked_of = tf.function(lambda s: blocked_top_k(s, 400, 400))  # (what the export runs from BLOCKED_FROM items)
matmul_ms, top_ms, blocked_ms = (timed(lambda: f(x), 10)[0] / 16 for f, x in (
    (scores_of, batch), (top_of, scores), (blocked_of, scores)))
start = time.perf_counter()
index = ApproximateIndex(vectors)
calibrated = index.calibrate(sample, 200, target_recall=0.97)
build_s = time.perf_counter() - start
q = iter(list(queries) * 2)
approx = timed(lambda: index.top_k(next(q)[None], 200), calls)
truth = exact_top_k(vectors, queries, 200)
found = index.top_k(queries, 200)
print("RESULT", json.dumps({"served_p50_ms": served[0], "served_p99_ms": served[1], "exact_p50_ms": exact[0],
                            "exact_p99_ms": exact[1], "ann_build_s": build_s, "ann_p50_ms": approx[0],
                            "ann_p99_ms": approx[1], "ann_recall": recall(found, truth), "sample_recall": calibrated,
                            "batch16_matmul_ms": matmul_ms, "batch16_top400_ms": top_ms,
                            "batch16_blocked_top400_ms": blocked_ms,
                            "ann": index.description}))
"""


def retrieval(data_dir: str, work: str, size: dict) -> list[dict]:
    """The two-tower stage trained (one epoch) and exported over the whole catalogue
    (MB written: the export),
    then top-200 per query in process: the export's `serving_default` (query tower,
    exact scores, the merged sources), an exact top-200 of the candidate vectors,
    and the faiss index (`dare_tf.retrieval.index`) with its recall@200 of the exact."""
    exports = os.path.join(work, "exports")
    for mine in (os.path.join(work, "retrieval"), os.path.join(exports, "retrieval")):  # (an earlier run's)
        shutil.rmtree(mine, ignore_errors=True)
    made = _run_result(["-c", RETRIEVAL_SCRIPT, data_dir, os.path.join(work, "retrieval"), exports, str(TOP_N)])
    top = _run_result(["-c", TOP_SCRIPT, os.path.join(exports, "retrieval"), data_dir, str(CALLS),
                       os.path.join(work, "retrieval")])
    row = {**size, "train_s": round(made["train_s"], 1), "export_s": round(made["export_s"], 1),
           "peak_rss_mib": round(made["peak_rss_mib"]),
           "mb_written": round(_size_mb(os.path.join(exports, "retrieval"))),
           **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in top.items()}}
    print(f"  {row}", flush=True)
    return [row]


# The batching files' batch_timeout_micros measured: the export's (1 ms) and a longer wait, which
# trades single-client latency for fuller batches of the retrieval model's matrix product.
BATCH_TIMEOUTS_MS = (1, 10)


def recommend(data_dir: str, work: str, size: dict) -> list[dict]:
    """`Recommender` over the stand-in serving both exports with the export's batching
    file (and that file with each of BATCH_TIMEOUTS_MS), from 1 and 16 client
    threads, CALLS recommendations of 10 from 200 candidates each."""
    import re

    from benchmarks.bench_cascade import served_load

    exports = os.path.join(work, "exports")
    rng = np.random.default_rng(0)
    users = [random_history(data_dir, rng, 200) for _ in range(CALLS * 2)]
    users = [(items, categories, {k: v[0] for k, v in fields.items()}) for items, categories, fields in users]
    with open(os.path.join(exports, "batching_parameters.txt")) as f:
        exported = f.read()
    rows = []
    for timeout_ms in BATCH_TIMEOUTS_MS:
        batching = os.path.join(work, f"batching_{timeout_ms}ms.txt")
        with open(batching, "w") as f:
            text, found = re.subn(r"batch_timeout_micros \{ value: \d+ \}",
                                  f"batch_timeout_micros {{ value: {timeout_ms * 1000} }}", exported)
            if found != 1:
                sys.exit(f"{exports}/batching_parameters.txt: no batch_timeout_micros line to set")
            f.write(text)
        server, port, _ = start_standin(f"--model_config_file={os.path.join(exports, 'models.config')}",
                                        f"--batching_parameters_file={batching}")
        try:
            for clients in (1, 16):
                latencies, seconds = served_load(port, clients, users[:CALLS] if clients == 1 else users)
                rows.append({**size, "batch_timeout_ms": timeout_ms, "clients": clients, "calls": len(latencies),
                             "p50_ms": round(float(np.percentile(latencies, 50)) * 1e3, 1),
                             "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 1),
                             "per_s": round(len(latencies) / seconds, 1),
                             "server_rss_mib": round(rss_mb(server.pid))})
                print(f"  {rows[-1]}", flush=True)
        finally:
            server.terminate()
            server.wait()
    return rows
