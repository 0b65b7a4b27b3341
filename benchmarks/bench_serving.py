"""Load test of the gRPC serving path: latency and throughput vs in-process SavedModel.

Usage: python benchmarks/bench_serving.py [--requests 10000] [--json PATH]

Trains DARE (L=200, K=20, d=16) briefly on the prepared Taobao sample (a
trained model: predictions and attention differ per request, as in
production), exports it, starts the test stand-in server
(serving/standin_server.py, with request batching) in its own process, and sends requests through serving.client:
batch 1 from one client, then batch 1 (`--requests`), 64 and 256 from 16
concurrent client threads. Reports
errors, p50/p99 latency, QPS and examples/s, beside the in-process
SavedModel's examples/s on the same batches.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.common import print_table, write_json  # noqa: E402
from dare_tf.data.protocol import prepare  # noqa: E402
from dare_tf.data.spec import read_id_map  # noqa: E402
from dare_tf.serving.client import ServingClient  # noqa: E402
from dare_tf.export import export_run  # noqa: E402
from dare_tf.training import TrainConfig, train  # noqa: E402

CLIENTS = 16


def make_requests(data_dir, batch, count, rng):
    items = np.array([int(r) for r in read_id_map(data_dir, "item")])
    cats = np.array([int(r) for r in read_id_map(data_dir, "category")])
    out = []
    for _ in range(count):
        out.append({"target_item": rng.choice(items, batch), "target_category": rng.choice(cats, batch),
                    "hist_items": rng.choice(items, (batch, 200)), "hist_categories": rng.choice(cats, (batch, 200))})
    return out


def load(port, requests, clients=16):
    latencies, errors = [], []
    lock = threading.Lock()
    queue = list(range(len(requests)))

    def worker():
        client = ServingClient(f"localhost:{port}", "dare", timeout=30.0)
        while True:
            with lock:
                if not queue:
                    break
                i = queue.pop()
            t0 = time.perf_counter()
            try:
                client.predict_tensors(requests[i])
                with lock:
                    latencies.append(time.perf_counter() - t0)
            except Exception as e:  # counted, not raised: the load test reports errors
                with lock:
                    errors.append(repr(e))
        client.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return np.array(latencies), errors, time.perf_counter() - start


def in_process(path, requests):
    fn = tf.saved_model.load(path).signatures["serving_default"]
    tensors = [{k: tf.constant(v, tf.int64) for k, v in r.items()} for r in requests]
    fn(**tensors[0])
    start = time.perf_counter()
    for t in tensors:
        fn(**t)
    return time.perf_counter() - start


def run_benchmark(work, args, rng):
    data_dir = os.path.join(work, "data")
    prepare("taobao", os.path.join(os.path.dirname(REPO), "shared", "data", "taobao", "UserBehavior_sample.csv"),
            data_dir)
    run_dir = os.path.join(work, "run")
    results = train(data_dir, run_dir, TrainConfig.create(preset="dare", batch_size=256, epochs=1, eval_every=10,
                                                   verbose=0, model_overrides=dict(top_k=20)))
    print(f"trained DARE: test AUC {results['test']['auc']:.4f}")
    path = export_run(run_dir, os.path.join(work, "exports"), "dare")
    server = subprocess.Popen([sys.executable, "-m", "serving.standin_server", f"--model_base={os.path.dirname(path)}",
                               "--model_name=dare", "--port=0"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    line = server.stdout.readline()
    port = int(line.split("localhost:")[1].split()[0])
    rows = []
    try:
        plan = [(1, 1, min(args.requests, 2000)), (1, CLIENTS, args.requests),
                (64, CLIENTS, max(args.requests // 10, 200)), (256, CLIENTS, 200)]
        for batch, clients, count in plan:
            requests = make_requests(data_dir, batch, count, rng)
            load(port, requests[: min(50, count)], clients)  # warm-up
            latencies, errors, seconds = load(port, requests, clients)
            local = in_process(path, requests[: min(count, 500)]) / min(count, 500) * count
            rows.append({
                "batch": batch, "clients": clients, "requests": count, "errors": len(errors),
                "p50_ms": float(np.percentile(latencies, 50) * 1e3) if len(latencies) else float("nan"),
                "p99_ms": float(np.percentile(latencies, 99) * 1e3) if len(latencies) else float("nan"),
                "qps": count / seconds, "served_examples_per_s": count * batch / seconds,
                "in_process_examples_per_s": count * batch / local,
                "served/in_process": local / seconds,
            })
            print_table(rows[-1:], list(rows[-1]))
            if errors:
                print("first errors:", errors[:3])
    finally:
        server.terminate()
        server.wait()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="batch-1 requests")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix="bench_serving_")
    try:
        rows = run_benchmark(work, args, rng)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the data, the run and the export (~25 MB)
    print("targets: p99 <= 10 ms at batch 1 (16 clients), served/in_process >= 0.8 at batch 256")
    print_table(rows, list(rows[0]))
    write_json("bench_serving", {"clients": CLIENTS, "results": rows}, args.json)


if __name__ == "__main__":
    main()
