"""Serving long histories: the ranker export's user-major `rank` signature against
the per-candidate `serving_default`, and the history service's reads.

Usage: python benchmarks/bench_long.py [--parts rank,histories] [--lengths 1000,10000]
                                       [--candidates 50,200] [--json PATH]

`rank` (measured in process: the SavedModel loaded here, `LocalModel`):
prepares a lifelong synthetic log (vocabularies and id maps for the export),
builds DARE (K=20, d=16, attention width 16, untrained: latency does not
depend on the weights) at L = each length, exports it and times, for one user
and N candidates, the `rank` signature (history sent once) and
`serving_default` with the history repeated per candidate (the path before
`rank`; only at N = 50 for L = 10,000). Each row has the request's bytes (the
serialized `PredictRequest`, what gRPC carries) beside one history plus the
candidates, p50/p99, and a bound from the sizes: the multiply-adds of the
score product (N x L x Da), the representation reads and the MLP, at the
float32 multiply-add rate a large matrix product reaches in the same process.

`standin`: the same exports and `rank` requests through the stand-in server
(its own process, batching on with the exported batching parameters), from
one client over gRPC, and from 8 concurrent clients (each user its own
request, merged by the batcher): p50/p99 and examples/s.

`histories` (in process): the history service's `last` for one user and for 64
users at L = 10,000 from the LMDB store and from a Redis server started here
(localhost), p50/p99 of 200 calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from benchmarks.common import print_table, selected_parts, start_standin, write_parts  # noqa: E402

PARTS = ("rank", "standin", "histories")


def percentiles(fn, calls: int) -> tuple[float, float]:
    """p50 and p99 milliseconds of `calls` calls of `fn` (after two warm-up calls)."""
    fn(), fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def multiply_add_rate() -> float:
    """float32 multiply-adds per second of a 1024 x 1024 matrix product here (numpy)."""
    a = np.random.default_rng(0).normal(size=(1024, 1024)).astype(np.float32)
    seconds = min(timeit(lambda: a @ a) for _ in range(5))
    return 1024**3 / seconds


def timeit(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def request_bytes(inputs: dict) -> int:
    """The serialized `PredictRequest` of `inputs` (what gRPC carries)."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request.ByteSize()


def bench_rank(args, work: str, parts: set) -> dict[str, list[dict]]:
    import dare_tf
    from dare_tf.data.preparation.protocol import Protocol
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.id_maps import read_id_map
    from dare_tf.data.generation.synthetic import SyntheticConfig, write
    from dare_tf.export import export_saved_model
    from dare_tf.serving.recommender import LocalModel
    from dare_tf.serving.encoding import rank_tensors, request_tensors

    log = os.path.join(work, "log.csv")
    write(SyntheticConfig(users=60, items=20_000, categories=200, min_length=1000, max_length=1000,
                          length_median=1000, length_sigma=0.0, seed=0), log)
    data_dir = os.path.join(work, "data")
    prepare("taobao", log, data_dir, Protocol(min_clicks=200))
    spec = DatasetSpec.load(data_dir)
    raw_items = np.array(read_id_map(data_dir, "item"), np.int64)
    raw_categories = np.array(read_id_map(data_dir, "category"), np.int64)
    rng = np.random.default_rng(0)
    rate = multiply_add_rate()
    rows, served = [], []
    for length in [int(v) for v in args.lengths.split(",")]:
        model = dare_tf.build_model("dare", spec.num_items, spec.num_categories, max_len=length,
                                    num_positions=length + 1, aux_attention="retrieved", seed=0)
        cfg = model.model_config
        path = export_saved_model(model, data_dir, os.path.join(work, "exports"), f"dare_{length}")
        local = LocalModel(path)
        history = rng.integers(0, len(raw_items), length)
        hist_items, hist_categories = raw_items[history], raw_categories[history % len(raw_categories)]
        da, dr = cfg.attention_width, cfg.representation_width
        head_in = dr * (4 if cfg.target_aware else 2)
        mlp = sum(a * b for a, b in zip((head_in, *cfg.mlp_units), (*cfg.mlp_units, 1)))
        requests = {}
        for n in [int(v) for v in args.candidates.split(",")]:
            targets = rng.integers(0, len(raw_items), n)
            items, categories = raw_items[targets], raw_categories[targets % len(raw_categories)]
            macs = n * length * da + n * cfg.top_k * dr * 2 + n * mlp
            requests[n] = {"rank": rank_tensors([hist_items], [hist_categories], [items], [categories])}
            if length * n <= args.repeated_limit:
                requests[n]["serving_default"] = request_tensors(items, categories, [hist_items] * n,
                                                                 [hist_categories] * n)
            for signature, inputs in requests[n].items() if "rank" in parts else ():
                p50, p99 = percentiles(lambda: local.predict_tensors(inputs, signature), args.calls)
                size, bound = request_bytes(inputs), 1000 * macs / rate
                rows.append({"L": length, "N": n, "signature": signature, "request_kb": size / 1024,
                             "bytes_over_history": size / (8 * (2 * length + 2 * n)), "p50_ms": p50, "p99_ms": p99,
                             "examples_per_s": 1000 * n / p50, "bound_ms": bound, "p50_over_bound": p50 / bound})
                print(f"  {rows[-1]}", flush=True)
        if "standin" in parts:
            served += bench_standin(args, os.path.dirname(os.path.dirname(path)), f"dare_{length}", length,
                                    {n: r["rank"] for n, r in requests.items()}, rows)
    if rows:
        print(f"rank vs serving_default (in process, SavedModel loaded here; DARE K=20 d=16; {os.cpu_count()} "
              f"CPUs; bound at {rate / 1e9:.1f} G multiply-adds/s)")
        print_table(rows, ["L", "N", "signature", "request_kb", "bytes_over_history", "p50_ms", "p99_ms",
                           "examples_per_s", "bound_ms", "p50_over_bound"])
    if served:
        print("rank through the stand-in server (its own process, batching on)")
        print_table(served, ["L", "N", "clients", "p50_ms", "p99_ms", "examples_per_s", "in_process_p50_ms"])
    return {"rank": rows, "standin": served}


def bench_standin(args, export_base: str, name: str, length: int, requests: dict, local_rows: list) -> list[dict]:
    """`rank` requests through the stand-in (batching on, the exported parameters)."""
    import threading

    from dare_tf.serving.client import ServingClient

    server, port, _ = start_standin(f"--model_base={export_base}/{name}", f"--model_name={name}",
                                    f"--batching_parameters_file={export_base}/batching_parameters.txt")
    rows = []
    try:
        for n, inputs in requests.items():
            in_process = next((r["p50_ms"] for r in local_rows if (r["L"], r["N"], r["signature"]) ==
                               (length, n, "rank")), None)
            for clients in (1, 8):
                stubs = [ServingClient(f"localhost:{port}", name, timeout=60.0) for _ in range(clients)]
                latencies = []

                def call(client):
                    for _ in range(args.calls // clients + 2):
                        start = time.perf_counter()
                        client.predict_tensors(inputs, "rank")
                        latencies.append(1000 * (time.perf_counter() - start))

                for client in stubs:  # warm-up
                    client.predict_tensors(inputs, "rank")
                threads = [threading.Thread(target=call, args=(c,)) for c in stubs]
                start = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                seconds = time.perf_counter() - start
                for client in stubs:
                    client.close()
                rows.append({"L": length, "N": n, "clients": clients, "p50_ms": float(np.percentile(latencies, 50)),
                             "p99_ms": float(np.percentile(latencies, 99)),
                             "examples_per_s": n * len(latencies) / seconds, "in_process_p50_ms": in_process})
                print(f"  {rows[-1]}", flush=True)
    finally:
        server.terminate()
        server.wait()
    return rows


def bench_histories(args, work: str) -> list[dict]:
    from dare_tf.histories import CLICK, open_store
    from dare_tf.testing.redis_server import RedisServer

    length, users = 10_000, 64
    rng = np.random.default_rng(0)
    clicks = {}
    for user in range(1, users + 1):
        rows = np.zeros(length, CLICK)
        rows["time"] = np.arange(length)
        rows["item"], rows["category"] = rng.integers(1, 10**9, length), rng.integers(1, 10**4, length)
        clicks[user] = rows
    rows = []
    with RedisServer(work) as redis_url:
        for url in (f"lmdb:{os.path.join(work, 'histories')}", redis_url):
            with open_store(url, max_clicks=length) as store:
                store.append_many(clicks)
                for count in (1, users):
                    ids = list(range(1, count + 1))
                    p50, p99 = percentiles(lambda: store.last(ids, length), args.calls)
                    rows.append({"store": url.split(":")[0], "users": count, "L": length, "p50_ms": p50,
                                 "p99_ms": p99, "clicks_per_s": 1000 * count * length / p50})
                    print(f"  {rows[-1]}", flush=True)
    print(f"history service reads, last(users, {length}) (in process; Redis on localhost)")
    print_table(rows, ["store", "users", "L", "p50_ms", "p99_ms", "clicks_per_s"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--lengths", default="1000,10000")
    parser.add_argument("--candidates", default="50,200")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeated_limit", type=int, default=500_000,
                        help="serving_default (history repeated per candidate) only where L x N is at most this")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = selected_parts(parser, args.parts, PARTS)
    work = tempfile.mkdtemp(prefix="bench_long_")
    payload = {}
    if parts & {"rank", "standin"}:
        measured = bench_rank(args, work, parts)
        payload.update({part: measured[part] for part in ("rank", "standin") if part in parts})
    if "histories" in parts:
        payload["histories"] = bench_histories(args, work)
    write_parts("bench_long", payload, sorted(payload), args.json)


if __name__ == "__main__":
    main()
