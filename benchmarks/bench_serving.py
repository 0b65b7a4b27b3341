"""Load test of the serving paths, gRPC and REST: latency, throughput and server memory.

Usage: python benchmarks/bench_serving.py [--parts grpc,rest] [--requests 10000] [--json PATH]

Trains DARE (L=200, K=20, d=16) briefly on the prepared Taobao sample (a
trained model: predictions and attention differ per request, as in
production), exports it, starts the test stand-in server
(`serving.standin_server`, with request batching and a REST port) in its own
process, and sends requests from 16 concurrent clients: through
`serving.client` over gRPC (`grpc`), and as TF Serving's REST JSON over HTTP
(`rest`, one kept-alive connection per client). Batch 1 from one client, then batch 1 (`--requests`), 64 and 256
from 16 clients. Reports errors, p50/p99 latency, QPS, examples/s beside the
in-process SavedModel's, and the server's resident memory before and after
each row (`rss_mb_before`, `rss_mb_after`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from dare_tf._startup import import_tensorflow_quietly  # noqa: E402

import_tensorflow_quietly()  # (TensorFlow's start-up notices filtered, as in the programs)
import tensorflow as tf  # noqa: E402

from benchmarks.common import print_table, rss_mb, selected_parts, start_standin, write_parts  # noqa: E402
from dare_tf.data.preparation.in_memory import prepare  # noqa: E402
from dare_tf.data.storage.id_maps import read_id_map  # noqa: E402
from dare_tf.export import export_run  # noqa: E402
from dare_tf.serving.client import ServingClient  # noqa: E402
from dare_tf.training import TrainConfig, train  # noqa: E402

CLIENTS = 16
PARTS = ("grpc", "rest")


def make_requests(data_dir, batch, count, rng):
    items = np.array([int(r) for r in read_id_map(data_dir, "item")])
    cats = np.array([int(r) for r in read_id_map(data_dir, "category")])
    out = []
    for _ in range(count):
        out.append({"target_item": rng.choice(items, batch), "target_category": rng.choice(cats, batch),
                    "hist_items": rng.choice(items, (batch, 200)), "hist_categories": rng.choice(cats, (batch, 200))})
    return out


class GrpcSender:
    def __init__(self, grpc_port, rest_port):
        self.client = ServingClient(f"localhost:{grpc_port}", "dare", timeout=30.0)

    def __call__(self, request):
        self.client.predict_tensors(request)

    def close(self):
        self.client.close()


class RestSender:
    """TF Serving's columnar REST request (`{"inputs": {...}}`) to /v1/models/dare:predict,
    over one kept-alive HTTP/1.1 connection per client."""

    def __init__(self, grpc_port, rest_port):
        self.connection = http.client.HTTPConnection("localhost", rest_port, timeout=30.0)

    def __call__(self, request):
        body = json.dumps({"inputs": {k: v.tolist() for k, v in request.items()}})
        self.connection.request("POST", "/v1/models/dare:predict", body, {"Content-Type": "application/json"})
        reply = self.connection.getresponse()
        payload = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {payload[:200]!r}")
        json.loads(payload)["outputs"]

    def close(self):
        self.connection.close()


SENDERS = {"grpc": GrpcSender, "rest": RestSender}


def load(sender, ports, requests, clients=16):
    latencies, errors = [], []
    lock = threading.Lock()
    queue = list(range(len(requests)))

    def worker():
        send = sender(*ports)
        while True:
            with lock:
                if not queue:
                    break
                i = queue.pop()
            t0 = time.perf_counter()
            try:
                send(requests[i])
                with lock:
                    latencies.append(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 (counted, not raised: the load test reports errors)
                with lock:
                    errors.append(repr(e))
        send.close()

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


def run_benchmark(work, args, parts, rng):
    data_dir = os.path.join(work, "data")
    prepare("taobao", os.path.join(os.path.dirname(REPO), "shared", "data", "taobao", "UserBehavior_sample.csv"),
            data_dir)
    run_dir = os.path.join(work, "run")
    results = train(data_dir, run_dir, TrainConfig.create(preset="dare", batch_size=256, epochs=1, eval_every=10,
                                                   verbose=0, model_overrides=dict(top_k=20)))
    print(f"trained DARE: test AUC {results['test']['auc']:.4f}")
    path = export_run(run_dir, os.path.join(work, "exports"), "dare")
    server, *ports = start_standin(f"--model_base={os.path.dirname(path)}", "--model_name=dare", "--rest_port=0")
    out = {part: [] for part in parts}
    try:
        plan = [(1, 1, min(args.requests, 2000)), (1, CLIENTS, args.requests),
                (64, CLIENTS, max(args.requests // 10, 200)), (256, CLIENTS, 200)]
        for part in parts:
            for batch, clients, count in plan:
                requests = make_requests(data_dir, batch, count, rng)
                load(SENDERS[part], ports, requests[: min(50, count)], clients)  # warm-up
                before = rss_mb(server.pid)
                latencies, errors, seconds = load(SENDERS[part], ports, requests, clients)
                local = in_process(path, requests[: min(count, 500)]) / min(count, 500) * count
                out[part].append({
                    "batch": batch, "clients": clients, "requests": count, "errors": len(errors),
                    "p50_ms": float(np.percentile(latencies, 50) * 1e3) if len(latencies) else float("nan"),
                    "p99_ms": float(np.percentile(latencies, 99) * 1e3) if len(latencies) else float("nan"),
                    "qps": count / seconds, "served_examples_per_s": count * batch / seconds,
                    "in_process_examples_per_s": count * batch / local,
                    "served/in_process": local / seconds,
                    "rss_mb_before": before, "rss_mb_after": rss_mb(server.pid),
                })
                print(part)
                print_table(out[part][-1:], list(out[part][-1]))
                if errors:
                    print("first errors:", errors[:3])
    finally:
        server.terminate()
        server.wait()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--requests", type=int, default=10_000, help="batch-1 requests")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = [p for p in PARTS if p in selected_parts(parser, args.parts, PARTS)]
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix="bench_serving_")
    try:
        out = run_benchmark(work, args, parts, rng)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the data, the run and the export (~25 MB)
    print("targets: 0 errors; p99 <= 10 ms at batch 1 (16 clients, gRPC); REST p99 <= 3x gRPC p99; "
          "served/in_process >= 0.8 at batch 256; server memory flat")
    for part in parts:
        print(part)
        print_table(out[part], list(out[part][0]))
    write_parts("bench_serving", dict(out, clients=CLIENTS), parts, args.json)


if __name__ == "__main__":
    main()
