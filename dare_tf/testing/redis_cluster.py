"""A throwaway Redis Cluster on free localhost ports, for the tests and benchmarks of
the cluster history store (`dare_tf.histories.cluster_store`): `masters` masters and
`replicas` replicas of each, `redis-server` processes in cluster mode with
append-only files, formed with redis-py's cluster commands (MEET, ADDSLOTS,
REPLICATE); one node can be killed (-9) and started again from its files. And
`ClickAppender`, a stream of live clicks whose acknowledged ones are kept, to check
after a fault that each is in the store exactly once (`lost_and_duplicated`)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

from dare_tf.testing.ports import free_port
from dare_tf.testing.redis_server import redis_server_binary

BUS_OFFSET = 10000  # redis-server's cluster bus port, this much above its port

SLOTS = 16384


class RedisCluster:
    """`with RedisCluster(directory) as url:` a cluster answering on every slot;
    `url` is `redis-cluster://127.0.0.1:P1,...`. `node_timeout_ms`: how long a
    master may not answer before its replica takes over."""

    def __init__(self, directory: str, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000,
                 start_timeout_s: float = 30.0):
        self.directory, self.masters, self.replicas = directory, masters, replicas
        self.node_timeout_ms, self.start_timeout_s = node_timeout_ms, start_timeout_s
        self.ports: list[int] = []
        for _ in range(masters * (1 + replicas)):
            self.ports.append(free_port(set(self.ports), bus_offset=BUS_OFFSET))
        self.processes: dict[int, subprocess.Popen] = {}
        self._met_at: dict[int, float] = {}

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, port: int) -> None:
        """Starts (or restarts, from its node file and append-only file) the node on `port`."""
        node_dir = os.path.join(self.directory, str(port))
        os.makedirs(node_dir, exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--dir", node_dir,
             "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: self.node(port).ping(), f"redis-server on port {port} did not start")

    def node(self, port: int):
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

    def _wait(self, ready, what: str) -> None:
        import redis

        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                if ready():
                    return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ResponseError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(what)
            time.sleep(0.05)

    def __enter__(self) -> str:
        for port in self.ports:
            self.start(port)
        first, started = self.node(self.ports[0]), time.monotonic()
        for port in self.ports[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        self._met_at = dict.fromkeys(self.ports, started)
        masters = self.ports[: self.masters]
        for i, port in enumerate(masters):
            low, high = i * SLOTS // self.masters, (i + 1) * SLOTS // self.masters - 1
            self.node(port).execute_command("CLUSTER", "ADDSLOTS", *range(low, high + 1))  # (6.2: no ADDSLOTSRANGE)
        self._wait(self._met, "the cluster's nodes did not meet")
        for i, port in enumerate(self.ports[self.masters:]):
            master_id = self.node(masters[i % self.masters]).execute_command("CLUSTER", "MYID")
            self.node(port).execute_command("CLUSTER", "REPLICATE", master_id)
        self._wait(lambda: all(self.node(p).info("replication").get("master_link_status") == "up"
                               for p in self.ports[self.masters:]), "the replicas did not sync")
        self.wait_ok()
        return self.url

    def _met(self) -> bool:
        """Whether every node knows every other one (no handshake pending); if not, each
        node is sent MEET again for the ports it does not list, every 2 s. A
        node drops a handshake its peer does not answer within the node timeout (a peer
        busy in an fsync on a loaded disk) and never retries it: one MEET can be lost."""
        now = time.monotonic()
        met = True
        for port in self.ports:
            nodes = self.node(port).execute_command("CLUSTER", "NODES").decode()
            listed = {int(m.group(1)) for m in re.finditer(r"^\S+ [\d.]*:(\d+)@\d+ (\S+)", nodes, re.M)
                      if "handshake" not in m.group(2)}
            missing = [p for p in self.ports if p != port and p not in listed]
            met = met and not missing
            if missing and now - self._met_at[port] >= 2.0:
                self._met_at[port] = now
                for other in missing:
                    self.node(port).execute_command("CLUSTER", "MEET", "127.0.0.1", other)
        return met

    def wait_ok(self) -> None:
        """Until every running node says `cluster_state:ok` and has no append-only file
        rewrite pending (a replica rewrites its AOF after each full sync and ignores
        SIGTERM until it has: "Writing initial AOF, can't exit")."""
        def ok(port: int) -> bool:
            persistence = self.node(port).info("persistence")
            return (b"cluster_state:ok" in self.node(port).execute_command("CLUSTER", "INFO")
                    and persistence["aof_rewrite_in_progress"] == 0 and persistence["aof_rewrite_scheduled"] == 0)

        self._wait(lambda: all(ok(p) for p in self.running()), "the cluster did not reach cluster_state:ok")

    def master_of(self, key: str) -> int:
        """The port of the master that holds `key`'s slot now."""
        import redis

        client = redis.RedisCluster(host="127.0.0.1", port=self.running()[0])
        try:
            return client.get_node_from_key(key).port
        finally:
            client.close()

    def running(self) -> list[int]:
        return [p for p, process in self.processes.items() if process.poll() is None]

    def kill(self, port: int) -> None:
        self.processes[port].kill()
        self.processes[port].wait()

    def stop(self) -> None:
        """SIGTERM to every node, then SIGKILL to those still running after 10 s (a replica
        stopped in the middle of its first sync can block in it past that)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 10.0
        for process in self.processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __exit__(self, *exc):
        self.stop()


class ClickAppender(threading.Thread):
    """Appends click k (item 1000 + k, at time k) of user `first_user + k % users`,
    k = 0, 1, ..., to the store at `url` until `stop` is set, one append at a time;
    keeps the acknowledged `(user, item)` pairs, each append's `(start, seconds)`,
    and the `StoreError` that ended it (None: stopped). `first_user`: past the
    users a store already holds, so that only these clicks are counted."""

    def __init__(self, url: str, users: int = 60, wait_replicas: int = 1, retry_s: float = 30.0,
                 first_user: int = 0):
        from dare_tf.histories import open_store

        super().__init__()
        self.users, self.first_user = users, first_user
        self.store = open_store(url, cluster={"wait_replicas": wait_replicas, "retry_s": retry_s})
        self.acknowledged, self.timings, self.error, self.stop = [], [], None, threading.Event()

    def run(self):
        from dare_tf.histories import StoreError

        k = 0
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                user = self.first_user + k % self.users
                self.store.append(user, [1000 + k], [k % 7 + 1], [k])
                self.timings.append((started, time.perf_counter() - started))
                self.acknowledged.append((user, 1000 + k))
                k += 1
        except StoreError as e:
            self.error = str(e)

    def lost_and_duplicated(self, url: str) -> tuple[list, int]:
        """The acknowledged clicks the store at `url` lacks, and the clicks it holds twice."""
        from dare_tf.histories import open_store

        with open_store(url, read_only=True, cluster={"retry_s": 30}) as store:
            users = [self.first_user + u for u in range(self.users)]
            history = store.last(users)
        found = {user: [int(i) for i in history.items[row, :history.lengths[row]]] for row, user in enumerate(users)}
        lost = [(u, i) for u, i in self.acknowledged if i not in found[u]]
        return lost, sum(len(items) - len(set(items)) for items in found.values())
