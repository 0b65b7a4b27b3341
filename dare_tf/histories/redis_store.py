"""RedisStore: the history store in a Redis server that a fleet of rankers shares.

Each user is one sorted set, `{prefix}{user_id}`, scored by click time; a
member is the packed big-endian `(sequence, item, category)`, where the
sequence (one server-wide counter) orders clicks of equal time by arrival and
keeps members unique. An append reserves its sequence numbers, then adds the
clicks, trims the set to `max_clicks` and records the user in one MULTI/EXEC
transaction; `last` is one ZRANGE per user, pipelined. Times are scores
(doubles): exact up to 2**53.
"""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import redis

from dare_tf.histories.base import CLICK, DEFAULT_MAX_CLICKS, HistoryStore, StoreError

_MEMBER = np.dtype([("sequence", ">u8"), ("item", ">i8"), ("category", ">i8")])
_FORMAT = "dare_tf.histories/1"
MAX_EXACT_TIME = 2**53


class RedisStore(HistoryStore):
    """The history store in the Redis server at `url` (`redis://HOST:PORT[/DB]`);
    keys start with `prefix`."""

    def __init__(self, url: str, read_only: bool = False, max_clicks: int | None = None,
                 prefix: str = "dare:histories:", timeout: float = 5.0):
        self.url, self.read_only, self.prefix = url, read_only, prefix
        try:
            self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            stored = self.client.get(prefix + "config")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise StoreError(f"{url}: no Redis server answers ({e})") from e
        except ValueError as e:  # a malformed URL
            raise StoreError(f"--store={url!r}: not a Redis URL ({e}); expected redis://HOST:PORT[/DB]") from e
        if stored is None:
            if read_only:
                raise StoreError(f"{url}: holds no history store (no {prefix}config key); nothing to read")
            config = {"format": _FORMAT, "max_clicks": max_clicks or DEFAULT_MAX_CLICKS}
            self.client.set(prefix + "config", json.dumps(config), nx=True)
            config = json.loads(self.client.get(prefix + "config"))
        else:
            config = json.loads(stored)
        if config.get("format") != _FORMAT:
            raise StoreError(f"{url}: {prefix}config is of format {config.get('format')!r}, expected {_FORMAT}")
        self.max_clicks = int(config["max_clicks"])

    def _key(self, user: int) -> str:
        return f"{self.prefix}u:{user}"

    def append_many(self, by_user: dict[int, np.ndarray]) -> dict[int, int]:
        self._writable()
        total = sum(len(c) for c in by_user.values())
        if not total:
            return {user: self.size(user) for user in by_user}
        for user, rows in by_user.items():
            if len(rows) and np.abs(rows["time"]).max() > MAX_EXACT_TIME:
                raise StoreError(f"{self.url}: user {user}: a click time beyond 2**53 is not exact as a Redis score")
        last = self.client.incrby(self.prefix + "sequence", total)
        sequence = last - total + 1
        with self.client.pipeline(transaction=True) as pipe:
            for user, rows in by_user.items():
                members = np.empty(len(rows), _MEMBER)
                members["sequence"] = np.arange(sequence, sequence + len(rows))
                members["item"], members["category"] = rows["item"], rows["category"]
                sequence += len(rows)
                packed = members.tobytes()
                width = _MEMBER.itemsize
                pipe.zadd(self._key(user), {packed[i * width:(i + 1) * width]: int(t)
                                            for i, t in enumerate(rows["time"])})
                pipe.zremrangebyrank(self._key(user), 0, -self.max_clicks - 1)
                pipe.sadd(self.prefix + "users", user)
                pipe.zcard(self._key(user))
            replies = pipe.execute()
        return {user: int(replies[4 * i + 3]) for i, user in enumerate(by_user)}

    def _read(self, users: list[int], max_len: int | None) -> list[np.ndarray]:
        with self.client.pipeline(transaction=False) as pipe:
            for user in users:  # only the last max_len members travel
                pipe.zrange(self._key(user), -max_len if max_len else 0, -1, withscores=True)
            replies = pipe.execute()
        return [self._decode(reply) for reply in replies]

    @staticmethod
    def _decode(reply) -> np.ndarray:
        rows = np.zeros(len(reply), CLICK)
        if reply:
            members = np.frombuffer(b"".join(m for m, _ in reply), _MEMBER)
            rows["item"], rows["category"] = members["item"], members["category"]
            rows["time"] = [int(score) for _, score in reply]
        return rows

    def size(self, user) -> int:
        return int(self.client.zcard(self._key(self._user(user))))

    def users(self) -> Iterator[int]:
        for user in self.client.sscan_iter(self.prefix + "users"):
            yield int(user)

    def __len__(self) -> int:
        return int(self.client.scard(self.prefix + "users"))

    def close(self) -> None:
        self.client.close()
