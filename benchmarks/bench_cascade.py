"""Two-stage recommendation: the retrieval index at 1M items, and `recommend` latency.

Usage: python benchmarks/bench_cascade.py [--parts index,merge,recommend] [--items 1000000] [--calls 300]
       [--json PATH]

index: 1M (`--items`) random 32-d candidate vectors in a
`tfrs.layers.factorized_top_k.BruteForce` index: build time, then top-200
query time for batches of 1 and 64 queries, against a brute-force numpy
top-200 (a matrix product and `argpartition`) on the same vectors; the ids
must agree exactly.

merge: the merged first N=200 candidates of 256 users with histories of 200
(`CandidateMerger`: each source's `top_k`, then sorts over their proposals)
against the same merge over catalogue-wide rank matrices (one `[B, C]` rank
per source, then a `[B, C]` key and its top-N: how the package merged before),
at catalogues of 10k, 100k and 1M items; the candidates must agree exactly.
Bound: the tower's top-k over its `[B, C]` scores is common to both
(`tower_top_k_ms`, timed alone: the floor); beyond it the merge reads `3 (N +
L) + 2N` proposals per user against `4C` rank and key entries
(`entries_read_ratio`).

recommend: a retrieval model (two-tower, one epoch) and DARE (L=200, K=20;
weights as built: latency does not depend on them) on the prepared Taobao
sample, exported. `Recommender.recommend` for histories of 200 behaviours
and N=200 candidates (the ranker's `rank` signature): in process (both
SavedModels loaded here), then through the stand-in server (its own process,
both models from one models.config, request batching on) from 1 and 16
concurrent client threads; then `recommend_user` by user id, the history read
from the history service (an LMDB store loaded from the dataset) at call
time, from 1 and 16 threads, with a writer appending a click every
millisecond during the 16-thread row (errors, server memory and store size
before and after). Reports p50/p99 latency and recommendations/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import dare_tf.retrieval  # noqa: E402

dare_tf.retrieval.use_keras2()  # tensorflow-recommenders needs tf.keras to be Keras 2
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402

from benchmarks.common import print_table, rss_mb, selected_parts, start_standin, write_parts  # noqa: E402

TOP_N = 200
SHARED = os.path.join(os.path.dirname(REPO), "shared", "data", "taobao", "UserBehavior_sample.csv")


def numpy_top_n(queries: np.ndarray, candidates: np.ndarray, n: int) -> np.ndarray:
    """Row-wise indices of the n highest dot products, highest first."""
    scores = queries @ candidates.T
    part = np.argpartition(-scores, n - 1, axis=1)[:, :n]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def bench_index(items: int, rng) -> list[dict]:
    candidates = rng.normal(size=(items, 32)).astype(np.float32)
    ids = np.arange(items, dtype=np.int64)
    start = time.perf_counter()
    index = tfrs.layers.factorized_top_k.BruteForce(k=TOP_N)
    index.index(tf.constant(candidates), tf.constant(ids))
    build = time.perf_counter() - start
    rows = []
    for batch in (1, 64):
        queries = rng.normal(size=(batch, 32)).astype(np.float32)
        index(tf.constant(queries))  # trace once
        times, np_times = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            _, got = index(tf.constant(queries))
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            want = numpy_top_n(queries, candidates, TOP_N)
            np_times.append(time.perf_counter() - t0)
        rows.append({"items": items, "queries": batch, "build_s": build,
                     "tfrs_query_ms": float(np.median(times) * 1e3), "numpy_query_ms": float(np.median(np_times) * 1e3),
                     "numpy/tfrs": float(np.median(np_times) / np.median(times)),
                     "same_top_200": bool((got.numpy() == want).all())})
    return rows


class RankMatrixMerge:
    """The baseline, as the package merged before `top_k` sources (TensorFlow ops): each
    source's rank of every catalogue slot `[B, C]`, the merge key over the catalogue
    (seen slots at infinity) and its top `n`."""

    def __init__(self, item_category, clicks, num_categories, depth, recent=3):
        size = len(item_category)
        self.size, self.depth, self.recent, self.num_categories = size, depth, recent, num_categories
        popularity = np.empty(size, np.float32)
        popularity[np.lexsort((np.arange(size), -clicks))] = np.arange(size)
        within = np.empty(size, np.float32)  # rank among the items of the same category
        by_category = np.lexsort((np.arange(size), -clicks, item_category))
        within[by_category] = np.arange(size) - np.searchsorted(item_category[by_category],
                                                                item_category[by_category])
        self.item_category, self.popularity, self.within = (tf.constant(a) for a in (item_category, popularity,
                                                                                       within))

    def __call__(self, scores, hist_items, hist_categories, quotas: dict, n: int):
        inf = tf.constant(np.inf, tf.float32)
        batch = tf.shape(scores)[0]
        depth = min(self.depth, self.size)
        top = tf.math.top_k(scores, k=depth).indices
        rows = tf.repeat(tf.range(batch)[:, None], depth, axis=1)
        tower = tf.tensor_scatter_nd_update(tf.fill([batch, self.size], inf), tf.stack([rows, top], -1),
                                            tf.tile(tf.range(depth, dtype=tf.float32)[None], [batch, 1]))
        popularity = tf.tile(self.popularity[None], [batch, 1])
        length = tf.shape(hist_categories)[1]
        position = tf.where(hist_items > 0, tf.range(length, dtype=tf.int32)[None], -1)
        segment = tf.cast(hist_categories, tf.int32) + tf.range(batch)[:, None] * self.num_categories
        last = tf.math.unsorted_segment_max(tf.reshape(position, [-1]), tf.reshape(segment, [-1]),
                                            batch * self.num_categories)
        last = tf.maximum(tf.reshape(last, [batch, self.num_categories]), -1)
        last = tf.concat([tf.fill([batch, 1], -1), last[:, 1:]], axis=1)
        recency = tf.argsort(tf.argsort(-last, axis=1, stable=True), axis=1, stable=True)
        recent = (last >= 0) & (recency < self.recent)
        by_category = self.within[None] * self.recent + tf.cast(tf.gather(recency, self.item_category, axis=1),
                                                                tf.float32)
        ranks = [tower, popularity, tf.where(tf.gather(recent, self.item_category, axis=1), by_category, inf)]
        key = tf.fill([batch, self.size], inf)
        for rank, name in zip(ranks, ("two_tower", "popularity", "recent_categories")):
            if quotas.get(name, 0) > 0:
                key = tf.minimum(key, (rank + 1.0) / quotas[name])
        slot = tf.cast(hist_items, tf.int32) - 1
        rows = tf.repeat(tf.range(batch)[:, None], length, axis=1)
        index = tf.boolean_mask(tf.stack([rows, slot], -1), slot >= 0)
        seen = tf.tensor_scatter_nd_update(tf.zeros([batch, self.size], tf.bool), index,
                                           tf.ones([tf.shape(index)[0]], tf.bool))
        return tf.math.top_k(-tf.where(seen, inf, key), k=n).indices.numpy()


def bench_merge(rng, sizes=(10_000, 100_000, 1_000_000), batch=256, length=200, n=TOP_N) -> list[dict]:
    from dare_tf.retrieval.candidates import CandidateMerger, Query

    rows, categories = [], 1000
    quotas = {"two_tower": 0.5, "popularity": 0.25, "recent_categories": 0.25}
    for size in sizes:
        item_category = rng.integers(1, categories, size)
        clicks = rng.integers(0, 50, size).astype(float)
        hist = rng.integers(1, size + 1, (batch, length)).astype(np.int32)
        hist_categories = item_category[hist - 1].astype(np.int32)
        scores = rng.normal(size=(batch, size)).astype(np.float32)
        merger = CandidateMerger(item_category, clicks, categories, depth=n + length)
        rank_matrices = RankMatrixMerge(item_category, clicks, categories, depth=n + length)

        def merged():
            return merger.merge(merger.proposals(Query(scores, hist, hist_categories), n), quotas, hist, n).numpy()

        def baseline():
            return rank_matrices(scores, hist, hist_categories, quotas, n)

        assert (merged() == baseline()).all(), f"the merges disagree at {size} items"
        seconds = {}
        def floor():  # the tower's top-k over the catalogue, which both merges do
            return tf.math.top_k(scores, k=n + length).indices.numpy()

        for name, call in (("proposals", merged), ("rank_matrices", baseline), ("tower_top_k", floor)):
            times = []
            for _ in range(3):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            seconds[name] = float(np.median(times))
        rows.append({"items": size, "users": batch, "proposals_ms": round(seconds["proposals"] * 1e3, 1),
                     "rank_matrices_ms": round(seconds["rank_matrices"] * 1e3, 1),
                     "speedup": round(seconds["rank_matrices"] / seconds["proposals"], 2),
                     "tower_top_k_ms": round(seconds["tower_top_k"] * 1e3, 1),
                     "proposals_over_top_k": round(seconds["proposals"] / seconds["tower_top_k"], 2),
                     "entries_read_ratio": round(4 * size / (3 * (n + length) + 2 * n), 1)})
        print(f"  {size:,} items done")
    return rows


def _percentiles(latencies) -> dict:
    return {"p50_ms": float(np.percentile(latencies, 50) * 1e3), "p99_ms": float(np.percentile(latencies, 99) * 1e3)}


def _users(data_dir: str, calls: int, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    from dare_tf.data.storage.id_maps import read_id_map

    items = np.array([int(r) for r in read_id_map(data_dir, "item")])
    cats = np.array([int(r) for r in read_id_map(data_dir, "category")])
    return [(rng.choice(items, 200), rng.choice(cats, 200)) for _ in range(calls)]


def _load(recommenders, users, by_id: bool = False) -> tuple[list[float], float]:
    """Each recommender in its own thread takes users from a shared queue (a history,
    `(items, categories[, fields])`, or with `by_id` a user id whose history the
    recommender's store holds)."""
    latencies, lock, queue = [], threading.Lock(), list(range(len(users)))

    def worker(recommender):
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop()
            t0 = time.perf_counter()
            if by_id:
                recommender.recommend_user(users[i], n=TOP_N, top=10)
            else:
                recommender.recommend(*users[i][:2], n=TOP_N, top=10, fields=(users[i][2:] or (None,))[0])
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(r,)) for r in recommenders]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - start


def served_load(port: int, clients: int, users) -> tuple[list[float], float]:
    """`_load` of `clients` recommenders over the stand-in on `port` (models `retrieval`
    and `dare`), after a warm-up of two users each (and the id-map check)."""
    from dare_tf.serving.recommender import Recommender
    from dare_tf.serving.client import ServingClient

    recommenders = [Recommender(ServingClient(f"localhost:{port}", "retrieval", timeout=60.0),
                                ServingClient(f"localhost:{port}", "dare", timeout=60.0)) for _ in range(clients)]
    _load(recommenders, users[:2 * clients])
    return _load(recommenders, users)


def bench_recommend(work: str, calls: int, rng) -> list[dict]:
    from dare_tf import build_model
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.retrieval import RetrievalConfig, train_retrieval
    from dare_tf.serving.recommender import LocalModel, Recommender
    from dare_tf.export import export_run, export_saved_model

    data = os.path.join(work, "taobao_sample")
    prepare("taobao", SHARED, data)
    spec = DatasetSpec.load(data)
    exports = os.path.join(work, "exports")
    train_retrieval(data, os.path.join(work, "retrieval"), RetrievalConfig(epochs=1))
    export_run(os.path.join(work, "retrieval"), exports, "retrieval", top_n=TOP_N)
    export_saved_model(build_model("dare", spec.num_items, spec.num_categories, max_len=spec.max_len, seed=0,
                                   top_k=20, embedding_dim=16), data, exports, "dare")
    users = _users(data, calls, rng)
    rows = []
    local = Recommender(LocalModel(os.path.join(exports, "retrieval")), LocalModel(os.path.join(exports, "dare")))
    _load([local], users[:20])  # warm-up
    latencies, seconds = _load([local], users)
    rows.append({"path": "in process", "clients": 1, "calls": calls, **_percentiles(latencies),
                 "recommendations_per_s": calls / seconds})
    server, port, _ = start_standin(f"--model_config_file={os.path.join(exports, 'models.config')}")
    try:
        for clients in (1, 16):
            latencies, seconds = served_load(port, clients, users)
            rows.append({"path": "stand-in server", "clients": clients, "calls": calls, **_percentiles(latencies),
                         "recommendations_per_s": calls / seconds})
        rows += _by_user_id(work, data, port, server.pid, calls, rng)
    finally:
        server.terminate()
        server.wait()
    for row in rows:
        row["served/in_process"] = row["recommendations_per_s"] / rows[0]["recommendations_per_s"]
    return rows


def _by_user_id(work: str, data: str, port: int, server_pid: int, calls: int, rng) -> list[dict]:
    """`recommend_user` through the stand-in, the histories read from an LMDB store at
    call time, from 1 and from 16 client threads; during the 16-client row a writer
    thread appends a click every millisecond. Counts errors, the server's resident
    memory and the store's size before and after each row."""
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared
    from dare_tf.serving.recommender import Recommender
    from dare_tf.serving.client import ServingClient

    path = os.path.join(work, "histories")
    rows = []
    with open_store(f"lmdb:{path}") as store:
        load_prepared(store, data)
        ids = list(store.users())
        users = [int(u) for u in rng.choice(ids, calls)]
        for clients in (1, 16):
            recommenders = [Recommender(ServingClient(f"localhost:{port}", "retrieval", timeout=60.0),
                                        ServingClient(f"localhost:{port}", "dare", timeout=60.0), histories=store)
                            for _ in range(clients)]
            _load(recommenders, users[:2 * clients], by_id=True)  # warm-up
            before = {"rss": rss_mb(server_pid), "store": os.path.getsize(os.path.join(path, "data.mdb"))}
            stop, appended, errors = threading.Event(), [0], []

            def write():
                while not stop.is_set():
                    user = int(rng.choice(ids))
                    try:
                        store.append(user, [int(rng.integers(1, 10**9))], [1], [10**9 + appended[0]])
                        appended[0] += 1
                    except Exception as e:  # noqa: BLE001 (counted, reported in the row)
                        errors.append(repr(e))
                    time.sleep(0.001)

            writer = threading.Thread(target=write) if clients > 1 else None
            if writer:
                writer.start()
            try:
                latencies, seconds = _load(recommenders, users, by_id=True)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
                latencies, seconds = [float("nan")], float("nan")
            stop.set()
            if writer:
                writer.join()
            rows.append({"path": "stand-in server, by user id (LMDB store)", "clients": clients, "calls": calls,
                         **_percentiles(latencies), "recommendations_per_s": calls / seconds,
                         "clicks_appended": appended[0], "errors": len(errors),
                         "server_rss_mb": f"{before['rss']:.0f} -> {rss_mb(server_pid):.0f}",
                         "store_mb": f"{before['store'] / 2**20:.1f} -> "
                                     f"{os.path.getsize(os.path.join(path, 'data.mdb')) / 2**20:.1f}"})
            print(f"  {rows[-1]}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="index,merge,recommend")
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=300, help="recommend calls per row")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = selected_parts(parser, args.parts, ("index", "merge", "recommend"))
    rng = np.random.default_rng(0)
    payload = {}
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs")
    if "index" in parts:
        print(f"index: BruteForce over {args.items:,} items (32-d), top {TOP_N}, against numpy")
        payload["index"] = bench_index(args.items, rng)
        print_table(payload["index"], list(payload["index"][0]))
    if "merge" in parts:
        print(f"merge: the first {TOP_N} merged candidates of 256 users (histories of 200), in process")
        payload["merge"] = bench_merge(rng)
        print_table(payload["merge"], list(payload["merge"][0]))
    if "recommend" in parts:
        print(f"recommend: histories of 200, N={TOP_N} candidates, top 10")
        work = tempfile.mkdtemp(prefix="bench_cascade_")
        try:
            payload["recommend"] = bench_recommend(work, args.calls, rng)
        finally:
            shutil.rmtree(work, ignore_errors=True)  # the data, the runs and the exports
        print_table(payload["recommend"], list(payload["recommend"][0]))
    write_parts("bench_cascade", payload, sorted(parts), args.json)


if __name__ == "__main__":
    main()
