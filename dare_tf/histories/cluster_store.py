"""ClusterStore: the history store on a Redis Cluster (`redis-cluster://HOST:PORT[,...]`,
redis-py's `RedisCluster`), sharded by hash slot, each master with its replicas.

The records are `RedisStore`'s; every key of one user carries the user's hash tag
(`{prefix}u:{<user>}`, `{prefix}a:{<user>}`), so a user lives on one shard and its
append is one WATCH/MULTI/EXEC transaction there; the store's own keys (config,
string-id tables, the users' set, notes) share the tag `{meta}`.

What an acknowledged append means (`wait_replicas`):

- 0 (default): each user's clicks are on the master of the user's slot when the
  append returns; a master killed before its replica copied them loses them at
  failover (Redis replicates asynchronously);
- N >= 1: the append also waits (`WAIT N`) until N replicas of that master hold
  them, so a failover to one of them keeps every acknowledged click. An append
  whose replicas do not confirm within `retry_s` ends with a StoreError naming
  the users appended before it.

Every user's append carries an id (`append_id`), written in the same transaction
(`a:{<user>}`): an append sent again after a failover, a MOVED or ASK redirect,
CLUSTERDOWN or a lost connection is applied once, whether or not its first try
reached the master; the retries stop after `retry_s` seconds with a StoreError
that counts what was appended.
"""

from __future__ import annotations

import contextlib
import hashlib
import time

import numpy as np
import redis
from redis.cluster import ClusterNode

from dare_tf.histories.base import PartialAppend, StoreError, merged
from dare_tf.histories.redis_store import RedisStore, intern_codes

SCHEME = "redis-cluster://"
CONFIRMED_TEXTS = 1_000_000  # strings an appender remembers as confirmed before it clears the memory
# What a cluster in failover raises: retried (after the topology is read again) until `retry_s`.
_TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ClusterDownError,
              redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
              redis.exceptions.ReadOnlyError, redis.exceptions.ClusterError)


class Unconfirmed(StoreError):
    """An append on its master that fewer replicas than asked confirmed."""


def startup_nodes(url: str) -> list[ClusterNode]:
    """The `HOST:PORT` nodes of a `redis-cluster://` URL."""
    nodes = []
    for entry in url[len(SCHEME):].split(","):
        host, _, port = entry.strip().rpartition(":")
        if not host or not port.isdigit():
            raise StoreError(f"--store={url!r}: {entry!r} is not HOST:PORT; expected {SCHEME}HOST:PORT[,HOST:PORT...]")
        nodes.append(ClusterNode(host, int(port)))
    return nodes


class ClusterStore(RedisStore):
    """The history store on the Redis Cluster at `url`; `wait_replicas` replicas
    confirm each append (see the module's docstring), retried for `retry_s`."""

    def __init__(self, url: str, read_only: bool = False, max_clicks: int | None = None,
                 prefix: str = "dare:histories:", timeout: float = 5.0, fields=None, string_ids: bool | None = None,
                 wait_replicas: int = 0, retry_s: float = 30.0):
        self.wait_replicas, self.retry_s = int(wait_replicas), float(retry_s)
        self._confirmed_texts: set[str] = set()  # (strings whose codes this store saw confirmed)
        self.retried = 0  # transient errors ridden through, for the programs' last line
        startup_nodes(url)  # (a malformed URL: its own line)
        try:
            super().__init__(url, read_only, max_clicks, prefix, timeout, fields, string_ids)
        except redis.exceptions.RedisClusterException as e:
            raise StoreError(f"{url}: no node of a Redis Cluster answers ({str(e).splitlines()[0]})") from None

    @staticmethod
    def _connect(url: str, timeout: float):
        return redis.RedisCluster(startup_nodes=startup_nodes(url), socket_timeout=timeout,
                                  socket_connect_timeout=timeout, require_full_coverage=True)

    def _meta(self, name: str) -> str:
        return f"{self.prefix}{{meta}}:{name}"

    def _key(self, user: int) -> str:
        return f"{self.prefix}u:{{{user}}}"

    def acknowledgement(self) -> str:
        """What an acknowledged append means for this store, in words."""
        if self.wait_replicas:
            return (f"each user's clicks on the master of its slot and on {self.wait_replicas} of its replicas "
                    f"(WAIT {self.wait_replicas})")
        return "each user's clicks on the master of its slot (replicated asynchronously: --wait_replicas for more)"

    resend_safe = True  # (an append sent again is applied once: its id is its content's)

    def append_many(self, by_user: dict[int, np.ndarray]) -> dict[int, int]:
        self._writable()
        out: dict[int, int] = {}
        for user, new in by_user.items():
            # The append's id is its content's digest: the same clicks sent again (a retry, or the
            # input resent after an error) are applied once.
            append_id = hashlib.blake2b(b"%d:" % user + np.ascontiguousarray(new).tobytes(), digest_size=16).hexdigest()
            try:
                out[user] = self._retrying(lambda: self._append_one(user, new, append_id))
                self._retrying(lambda: self.client.sadd(self._meta("users"), user))
            except StoreError as e:
                unconfirmed = {user: len(new)} if isinstance(e, Unconfirmed) else {}
                if unconfirmed:  # (its clicks are on the master: the user is listed)
                    self._retrying(lambda: self.client.sadd(self._meta("users"), user))
                said = f"; user {user}'s {len(new)} clicks are on its master, not confirmed" if unconfirmed else ""
                raise PartialAppend(f"{e} ({len(out)} of the batch's {len(by_user)} users appended before it{said})",
                                    {u: len(by_user[u]) for u in out}, unconfirmed) from None
        return out

    def _intern(self, texts: list[str], create: bool) -> np.ndarray:
        """`RedisStore`'s codes, ridden through a failover; where `wait_replicas` is set, new
        codes are written on one connection to the `{meta}` master and confirmed by `WAIT`
        before any click uses them (an acknowledged append's strings survive a failover)."""
        if not (create and self.wait_replicas):
            return self._retrying(lambda: RedisStore._intern(self, texts, create))
        return self._retrying(lambda: self._intern_confirmed(texts))

    def _intern_confirmed(self, texts: list[str]) -> np.ndarray:
        """New codes written and confirmed; codes read that this store has not confirmed
        before (another appender may have written them and not yet had its WAIT answered,
        or died before it) confirmed too: a write on the same connection (a counter) then
        WAIT, which the replication stream's order makes cover the writes read."""
        with self._connection(self._meta("ids")) as command:
            codes, new = intern_codes(command.many, self._meta, texts, create=True)
            read = len(set(texts) - set(new) - self._confirmed_texts)
            created = len(new)
            if created or read:
                if not created:
                    command("INCR", self._meta("confirmations"))
                what = " and ".join(([f"{created} new strings"] if created else [])
                                    + ([f"{read} strings already written"] if read else []))
                self._confirmed(command, f"the codes of {what}")
                if len(self._confirmed_texts) > CONFIRMED_TEXTS:
                    self._confirmed_texts.clear()
                self._confirmed_texts.update(texts)
            return codes

    @contextlib.contextmanager
    def _connection(self, key: str):
        """`command(*args)` on one connection to the master of `key`'s slot (WAIT counts
        that connection's writes), and `command.many(commands)`: their replies, the
        commands sent in one round trip."""
        node = self.client.get_node_from_key(key, replica=False)
        pool = self.client.get_redis_connection(node).connection_pool
        connection = pool.get_connection()
        try:
            def command(*args):
                return command.many([args])[0]

            def many(commands):
                connection.send_packed_command(connection.pack_commands(commands))
                return [connection.read_response() for _ in commands]

            command.many = many
            yield command
        except BaseException:
            connection.disconnect()  # (its state is unknown: a WATCH or MULTI may be open)
            raise
        finally:
            pool.release(connection)

    def _confirmed(self, command, what: str) -> None:
        """`WAIT` for `wait_replicas` replicas of the connection's writes, or `Unconfirmed`."""
        acked = command("WAIT", self.wait_replicas, int(self.retry_s * 1000))
        if acked < self.wait_replicas:
            raise Unconfirmed(f"{self.url}: {what} reached {acked} replicas of its master, not "
                              f"--wait_replicas={self.wait_replicas}, within {self.retry_s:g} s")

    def _read(self, users: list[int], max_len: int | None) -> list[np.ndarray]:
        """`RedisStore`'s pipelined reads, ridden through a failover as appends are."""
        return self._retrying(lambda: self._read_pipelined(users, max_len))

    def _retrying(self, call):
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                return call()
            except _TRANSIENT as e:
                if time.monotonic() > deadline:
                    raise StoreError(f"{self.url}: the cluster did not answer within --retry_s={self.retry_s:g} "
                                     f"({type(e).__name__}: {e})") from None
                self.retried += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                try:
                    self.client.nodes_manager.initialize()  # (the slots' masters after a failover)
                except _TRANSIENT:
                    pass

    def _append_one(self, user: int, new: np.ndarray, append_id: str) -> int:
        """One user's clicks in one transaction on the master of its slot, on one
        connection (WAIT counts that connection's writes); applied once per `append_id`."""
        key, marker = self._key(user), f"{self.prefix}a:{{{user}}}"
        with self._connection(key) as command:
            while True:
                command("WATCH", key, marker)
                old, done = command("GET", key), command("GET", marker)
                if done is not None and done.decode() == append_id:  # (a retry of an applied append)
                    command("UNWATCH")
                    packed = old or b""
                    break
                packed = merged(old, new, self.max_clicks)
                command("MULTI")
                command("SET", key, packed)
                command("SET", marker, append_id)
                if command("EXEC") is not None:
                    break  # (None: another writer changed the user: again)
            if self.wait_replicas:
                self._confirmed(command, f"user {user}'s append")
            return len(packed) // self.dtype.itemsize
