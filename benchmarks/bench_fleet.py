r"""A fleet on one machine: 16 clients of `recommend` by user id (the history read
from the store at call time, the retrieval model's candidates, the ranker's
`rank`) against one or two model servers (stand-ins, balanced round robin) and a
history store in LMDB, one Redis, or a Redis Cluster (3 masters, a replica each);
then each fault under the same load, with an appender of live clicks beside it.

  python benchmarks/bench_fleet.py [--seconds=8] [--work_dir DIR]

Parts (one JSON, results/bench_fleet.json; docs/serving.md's "A fleet" tables):

- `load`: recommendations/s, p50 and p99 latency (ms, through the stand-in
  server) and failures, per store and number of model servers;
- `faults`, on the cluster with two model servers and an appender acknowledging
  each click on its master and one replica (`--wait_replicas=1`):
  `master kill` (kill -9 of the master of a user's slot, started again 4 s later:
  it comes back as its replica's replica), `replica kill` (kill -9 of a replica,
  started again 4 s later: the appends waiting on it resume) and `model server
  kill` (kill -9 of one stand-in, started again 4 s later): failed
  recommendations, acknowledged clicks lost and duplicated (both must be 0),
  and the seconds from the kill until recommendations and appends answer
  within twice their p99 before it.

The models: DARE and the retrieval stage trained briefly on a log generated like
the Taobao sample (`data.synthetic --like=taobao --sample`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, run_program, write_json  # noqa: E402

CLIENTS = 16
RESTART_AFTER_S = 4.0


def build(work: str) -> tuple[str, str]:
    """The prepared dataset and the exports' models.config."""
    log, data, runs, exports = (os.path.join(work, n) for n in ("log.csv", "data", "runs", "exports"))
    steps = [(["data.synthetic", "--like=taobao", "--sample", f"--output={log}"], "synthetic"),
             (["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={data}"], "prepare"),
             (["trainers.train", "--model=dare", f"--data_dir={data}", f"--output_dir={runs}/dare", "--batch_size=256",
               "--epochs=1", "--top_k=10", "--verbose=0"], "train"),
             (["trainers.train_retrieval", f"--data_dir={data}", f"--output_dir={runs}/retrieval", "--epochs=2"],
              "train_retrieval"),
             (["serving.export", f"--run_dir={runs}/dare", f"--export_base={exports}", "--model_name=dare"], "export"),
             (["serving.export", f"--run_dir={runs}/retrieval", f"--export_base={exports}",
               "--model_name=retrieval"], "export_retrieval")]
    for args, name in steps:
        if not os.path.exists(os.path.join(work, f"{name}.done")):
            run_program(args, os.path.join(work, f"{name}.log"))
            open(os.path.join(work, f"{name}.done"), "w").close()
    return data, os.path.join(exports, "models.config")


def start_server(config: str, port: int):
    from dare_tf.testing.standin_server import standin_process

    return standin_process(port, f"--model_config_file={config}", cwd=REPO)


class Load:
    """`CLIENTS` threads of `recommend_user` over `users`, each call timed."""

    def __init__(self, target: str, store_url: str, users: list[int]):
        self.target, self.store_url, self.users = target, store_url, users
        self.calls, self.failures, self.stop = [], [], threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(CLIENTS)]

    def client(self, i: int) -> None:
        from dare_tf.serving.client import ServingClient
        from dare_tf.serving.recommender import Recommender

        rng = np.random.default_rng(i)
        clients = [ServingClient(self.target, name, timeout=10, retries=3, backoff=0.05)
                   for name in ("retrieval", "dare")]
        recommender = Recommender(*clients, histories=self.store)  # (one store: LMDB opens once per process)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                recommender.recommend_user(int(rng.choice(self.users)), n=200, top=10)
                self.calls.append((started, time.perf_counter() - started))
            except Exception as e:  # noqa: BLE001 (every failure counts)
                self.failures.append((started, repr(e)[:200]))
        for c in clients:
            c.close()

    def __enter__(self):
        from dare_tf.histories import open_store

        self.store = open_store(self.store_url, read_only=True)
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        self.store.close()


def summary(calls, seconds: float) -> dict:
    latencies = np.array([d for _, d in calls]) * 1000
    return {"per_s": len(calls) / seconds, "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99))}


def recovery_s(calls, killed: float, p99_before: float) -> float:
    """Seconds from `killed` until the calls started after it answer within twice `p99_before` again for good."""
    late = [(at, d) for at, d in calls if at >= killed]
    slow = [at + d for at, d in late if d * 1000 > 2 * p99_before]
    return max(slow) - killed if slow else 0.0


def bench_load(data: str, config: str, seconds: float, work: str) -> list[dict]:
    from dare_tf.testing.ports import free_port
    from dare_tf.testing.redis_cluster import RedisCluster
    from dare_tf.testing.redis_server import RedisServer

    rows = []
    with RedisServer(work) as redis_url, RedisCluster(os.path.join(work, "cluster")) as cluster_url:
        stores = {"lmdb": f"lmdb:{os.path.join(work, 'histories')}", "redis": redis_url, "cluster": cluster_url}
        for url in stores.values():
            run_program(["serving.histories", "load", f"--data_dir={data}", f"--store={url}"],
                        os.path.join(work, "load.log"))
        users = users_of(stores["lmdb"])
        ports = [free_port(), free_port()]
        servers = [start_server(config, p) for p in ports]
        try:
            for store, url in stores.items():
                for n in (1, 2):
                    target = ",".join(f"127.0.0.1:{p}" for p in ports[:n])
                    with Load(target, url, users) as load:
                        time.sleep(seconds)
                    rows.append({"store": store, "model_servers": n, **summary(load.calls, seconds),
                                 "failures": len(load.failures)})
                    print(rows[-1], flush=True)
        finally:
            for s in servers:
                s.kill()
    return rows


def users_of(url: str) -> list[int]:
    from dare_tf.histories import open_store

    with open_store(url, read_only=True) as store:
        return sorted(store._users())


def bench_faults(data: str, config: str, seconds: float, work: str) -> list[dict]:
    from dare_tf.testing.redis_cluster import ClickAppender, RedisCluster
    from dare_tf.testing.ports import free_port

    rows = []
    for fault in ("master kill", "replica kill", "model server kill"):
        cluster = RedisCluster(tempfile.mkdtemp(dir=work))
        with cluster as url:
            run_program(["serving.histories", "load", f"--data_dir={data}", f"--store={url}"],
                        os.path.join(work, "load.log"))
            users = users_of(url)
            ports = [free_port(), free_port()]
            servers = [start_server(config, p) for p in ports]
            appender = ClickAppender(url, wait_replicas=1, retry_s=60.0, first_user=10**12)  # (not the dataset's)
            try:
                with Load(",".join(f"127.0.0.1:{p}" for p in ports), url, users) as load:
                    appender.start()
                    time.sleep(seconds / 2)
                    p99 = summary(list(load.calls), 1)["p99_ms"]
                    append_p99 = summary(list(appender.timings), 1)["p99_ms"]
                    killed = time.perf_counter()
                    if fault == "model server kill":
                        servers[0].send_signal(signal.SIGKILL)
                        servers[0].wait()
                        time.sleep(RESTART_AFTER_S)
                        servers[0] = start_server(config, ports[0])
                    else:
                        port = cluster.master_of(appender.store._key(10**12)) if fault == "master kill" else \
                            next(p for p in cluster.ports[3:] if p in cluster.running())
                        cluster.kill(port)
                        time.sleep(RESTART_AFTER_S)
                        cluster.start(port)
                    time.sleep(seconds)
                    appender.stop.set()
                    appender.join(120)
            finally:
                for s in servers:
                    s.kill()
            lost, duplicated = appender.lost_and_duplicated(url)
            rows.append({"fault": fault, "recommendations": len(load.calls), "failed": len(load.failures),
                         "appended": len(appender.acknowledged), "append_error": appender.error or "",
                         "acknowledged_lost": len(lost), "duplicated": duplicated,
                         "recommend_recovery_s": recovery_s(load.calls, killed, p99),
                         "append_recovery_s": recovery_s(appender.timings, killed, append_p99),
                         "cluster_errors_retried": appender.store.retried})
            print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_fleet-")
    os.makedirs(work, exist_ok=True)
    data, config = build(work)
    load = bench_load(data, config, args.seconds, tempfile.mkdtemp(dir=work))
    print_table(load, ["store", "model_servers", "per_s", "p50_ms", "p99_ms", "failures"])
    faults = bench_faults(data, config, args.seconds, work)
    print_table(faults, ["fault", "recommendations", "failed", "appended", "acknowledged_lost", "duplicated",
                         "recommend_recovery_s", "append_recovery_s"])
    write_json("bench_fleet", {"clients": CLIENTS, "seconds": args.seconds, "load": load, "faults": faults},
               args.json)


if __name__ == "__main__":
    main()
