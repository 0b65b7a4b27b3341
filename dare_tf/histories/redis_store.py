"""RedisStore: the history store in a Redis server that a fleet of rankers shares.

Each user is one string, `{prefix}u:{user_id}`, holding its clicks as packed
little-endian int64 `(time, item, category)` triples (`CLICK`), oldest first:
the LMDB store's record. `last` is one GETRANGE of the last `max_len` clicks
per user, pipelined; an append reads the users' strings under WATCH, merges
the new clicks in time order (`merged`, as the LMDB store does) and writes
them back with the users set in one MULTI/EXEC transaction, retried when
another writer changed one of them meanwhile.
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterator

import numpy as np
import redis

from dare_tf.histories.base import DEFAULT_MAX_CLICKS, HistoryStore, StoreError, merged

_FORMAT = "dare_tf.histories/1"
INTERN_BATCH = 10_000  # new string ids numbered a batch, in two round trips (`intern_codes`)
# What a Redis server that stopped answering raises.
_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisStore(HistoryStore):
    """The history store in the Redis server at `url` (`redis://HOST:PORT[/DB]`);
    keys start with `prefix`."""

    def __init__(self, url: str, read_only: bool = False, max_clicks: int | None = None,
                 prefix: str = "dare:histories:", timeout: float = 5.0, fields=None, string_ids: bool | None = None):
        self.url, self.read_only, self.prefix = url, read_only, prefix
        try:
            self.client = self._connect(url, timeout)
            stored = self.client.get(self._meta("config"))
            if stored is None and not read_only:
                config = {"format": _FORMAT, "max_clicks": max_clicks or DEFAULT_MAX_CLICKS,
                          **({"fields": list(fields)} if fields else {}),
                          **({"string_ids": True} if string_ids else {})}
                self.client.set(self._meta("config"), json.dumps(config), nx=True)  # (a concurrent creator wins)
                stored = self.client.get(self._meta("config"))
        except _DOWN as e:
            raise StoreError(f"{url}: no Redis server answers ({e})") from e
        except StoreError:
            raise
        except ValueError as e:  # a malformed URL
            raise StoreError(f"--store={url!r}: not a Redis URL ({e}); expected redis://HOST:PORT[/DB]") from e
        if stored is None:
            raise StoreError(f"{url}: holds no history store (no {self._meta('config')} key); nothing to read")
        config = json.loads(stored)
        if config.get("format") != _FORMAT:
            raise StoreError(f"{url}: {self._meta('config')} is of format {config.get('format')!r}, expected {_FORMAT}")
        self._configured(config, fields, string_ids)

    @staticmethod
    def _connect(url: str, timeout: float):
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        # (a node of a Redis Cluster answers MOVED for most keys: said at once, not after a load's first batch)
        try:
            cluster = str(client.info("cluster").get("cluster_enabled", 0)) == "1"
        except redis.ResponseError:  # (a server that does not answer INFO: taken as a plain one)
            cluster = False
        if cluster:
            where = url.split("://", 1)[-1].split("/", 1)[0]
            raise StoreError(f"{url}: is a Redis Cluster node; use redis-cluster://{where} (any of its nodes)")
        return client

    def _meta(self, name: str) -> str:
        """The key of the store's own `name` (config, ids, names, next_id, users, note:...)."""
        return self.prefix + name

    @contextlib.contextmanager
    def _answering(self):
        """A server that stops answering mid-call: one StoreError, not redis-py's chain."""
        try:
            yield
        except _DOWN as e:
            raise StoreError(f"{self.url}: the Redis server stopped answering ({type(e).__name__}: {e})") from None

    def _intern(self, texts: list[str], create: bool) -> np.ndarray:
        """Codes from the hash `ids` (string -> code) and `names` (code -> string)
        (`intern_codes`: two round trips a batch of new strings, not three a string)."""
        with self._answering():
            return intern_codes(self._pipelined, self._meta, texts, create)[0]

    def _pipelined(self, commands: list[tuple]) -> list:
        """The replies of `commands`, sent in one round trip (no transaction)."""
        with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return pipe.execute()

    def _texts(self, codes) -> list[str]:
        with self._answering():
            names = self.client.hmget(self._meta("names"), [int(c) for c in codes])
        unknown = [int(c) for c, t in zip(codes, names) if t is None]
        if unknown:  # (a code whose string the store lost: a failover of the {meta} shard)
            raise StoreError(f"{self.url}: the store holds clicks with codes {unknown[:5]} that name no string "
                             f"(its {self._meta('names')} lacks them: lost in a failover?); load the store again")
        return [t.decode() for t in names]

    def _key(self, user: int) -> str:
        return f"{self.prefix}u:{user}"

    def append_many(self, by_user: dict[int, np.ndarray]) -> dict[int, int]:
        with self._answering():
            self._writable()
            if not by_user:
                return {}
            keys = [self._key(user) for user in by_user]
            with self.client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(*keys)
                        packed = [merged(old, new, self.max_clicks)
                                  for new, old in zip(by_user.values(), pipe.mget(keys))]
                        pipe.multi()
                        pipe.mset(dict(zip(keys, packed)))
                        pipe.sadd(self._meta("users"), *by_user)
                        pipe.execute()
                        return {user: len(p) // self.dtype.itemsize for user, p in zip(by_user, packed)}
                    except redis.WatchError:  # another writer changed one of these users: again
                        continue

    def _read(self, users: list[int], max_len: int | None) -> list[np.ndarray]:
        with self._answering():
            return self._read_pipelined(users, max_len)

    def _read_pipelined(self, users: list[int], max_len: int | None) -> list[np.ndarray]:
        with self.client.pipeline(transaction=False) as pipe:
            for user in users:  # only the last max_len clicks travel
                pipe.getrange(self._key(user), -self.dtype.itemsize * max_len if max_len else 0, -1)
            return [np.frombuffer(value, self.dtype) for value in pipe.execute()]

    def note(self, name: str, value: str | None = None) -> str | None:
        with self._answering():
            if value is not None:
                self._writable()
                self.client.set(self._meta(f"note:{name}"), value)
            stored = self.client.get(self._meta(f"note:{name}"))
            return None if stored is None else stored.decode()

    def size(self, user) -> int:
        with self._answering():
            return int(self.client.strlen(self._key(self._user(user)))) // self.dtype.itemsize

    def _users(self) -> Iterator[int]:
        for user in self.client.sscan_iter(self._meta("users")):
            yield int(user)

    def __len__(self) -> int:
        with self._answering():
            return int(self.client.scard(self._meta("users")))

    def close(self) -> None:
        self.client.close()


def intern_codes(run, meta, texts: list[str], create: bool) -> tuple[np.ndarray, list[str]]:
    """The int64 codes of `texts` in a Redis store's hashes `meta("ids")` (string ->
    code) and `meta("names")` (code -> string), -1 for a string without one unless
    `create`. New strings are numbered in order of first appearance from `meta("next_id")`
    (one INCRBY per `INTERN_BATCH`), each name written before its code, and of two
    writers numbering one string at once the first code is kept (HSETNX; the other's
    number is left unused). `run(commands)` sends a list of commands in one round trip
    on one connection, in order, and returns their replies. Returns the codes and the
    strings that had none when read (each once)."""
    ids, names, next_id = meta("ids"), meta("names"), meta("next_id")
    (found,) = run([("HMGET", ids, *texts)])
    made: dict[str, int] = {}
    new = list(dict.fromkeys(text for text, code in zip(texts, found) if code is None))
    for start in range(0, len(new) if create else 0, INTERN_BATCH):
        batch = new[start:start + INTERN_BATCH]
        (top,) = run([("INCRBY", next_id, len(batch))])
        fresh = range(top - len(batch) + 1, top + 1)
        written = run([("HSET", names, *(x for pair in zip(fresh, batch) for x in pair)),
                       *(("HSETNX", ids, text, code) for text, code in zip(batch, fresh))])[1:]
        made.update(zip(batch, fresh))
        lost = [text for text, kept in zip(batch, written) if not kept]
        if lost:  # (another writer numbered them first: its codes)
            (codes,) = run([("HMGET", ids, *lost)])
            made.update(zip(lost, (int(code) for code in codes)))
    return np.array([made.get(text, -1) if code is None else int(code) for text, code in zip(texts, found)],
                    np.int64), new
