"""The history service: every user's click sequence, held next to the rankers,
read at request time and appended as clicks arrive.

One interface, `HistoryStore`, with two stores behind `open_store(url)`:

- `lmdb:DIR` (`LmdbStore`, the embedded default): one LMDB environment
  (memory-mapped, many readers beside one writer, crash-safe commits).
- `redis://HOST:PORT[/DB]` (`RedisStore`): a Redis server that a fleet of
  rankers shares (one string per user, the same packed records).

Raw ids only (int64 user, item and category ids and int64 times), so a store
never depends on a model's id maps. Semantics, the same for both stores:

- A user's clicks are kept in time order: a click older than the user's last
  is inserted at its place (ties keep their arrival order), not refused.
- Each user keeps at most `max_clicks` clicks (set when the store is created,
  recorded in it); the oldest are dropped.
- A store created with further `fields` (a brand, a seller: a prepared
  dataset's column fields, `dare_tf.data.storage.fields`) keeps their raw values with
  every click; an append must give exactly those (one-line `StoreError`).
- `last` never sees a half-written append (LMDB: one write transaction per
  append; Redis: one MULTI/EXEC, retried under WATCH when another writer
  changed the same users), and an append is durable once it returns
  (LMDB syncs each commit; Redis as its own persistence is configured): a
  killed writer loses at most the append it had not returned from.
- An unknown user has an empty history (length 0), the model's defined answer.
"""

from __future__ import annotations

from dare_tf.histories.base import (CLICK, DEFAULT_MAX_CLICKS, Histories, HistoryStore, StoreError, click_dtype,
                                    clicks)


def open_store(url: str, read_only: bool = False, max_clicks: int | None = None, fields=None,
               string_ids: bool | None = None, cluster: dict | None = None) -> HistoryStore:
    """The store at `url`: `lmdb:DIR` (created when missing, unless `read_only`),
    `redis://HOST:PORT[/DB]` or `redis-cluster://HOST:PORT[,HOST:PORT...]` (a
    Redis Cluster; `cluster`: `ClusterStore`'s `wait_replicas` and `retry_s`).
    `max_clicks`, `fields` (names of further fields) and `string_ids` (string
    ids, `--string_ids`) apply to a store created now
    (default `DEFAULT_MAX_CLICKS`, none, integer ids); an existing store keeps
    those it was created with (other `fields` or ids are refused; None: any)."""
    if url.startswith("lmdb:"):
        from dare_tf.histories.lmdb_store import LmdbStore

        return LmdbStore(url[len("lmdb:"):], read_only, max_clicks, fields, string_ids)
    if url.startswith("redis-cluster://"):
        from dare_tf.histories.cluster_store import ClusterStore

        return ClusterStore(url, read_only, max_clicks, fields=fields, string_ids=string_ids, **(cluster or {}))
    if url.startswith("redis://"):
        from dare_tf.histories.redis_store import RedisStore

        return RedisStore(url, read_only, max_clicks, fields=fields, string_ids=string_ids)
    raise StoreError(f"--store={url!r}: a history store is lmdb:DIR, redis://HOST:PORT or "
                     "redis-cluster://HOST:PORT[,HOST:PORT...]")


__all__ = ["CLICK", "DEFAULT_MAX_CLICKS", "Histories", "HistoryStore", "StoreError", "click_dtype", "clicks",
           "open_store"]
