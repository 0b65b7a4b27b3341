"""Reading a prepared dataset into memory: the per-user sequence store and the
compact examples (`dare_tf.data.preparation.protocol` writes them, `dare_tf.data.storage.records`
reads and checks each TFRecord shard), of all partitions or of a worker's
own, and the assembly of each example's last-L history window in numpy;
`dare_tf.data.feeding.pipeline` does the same assembly in TensorFlow, a batch at a
time.
"""

from __future__ import annotations

import os

import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.records import ShardError, read_shards
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.shards import STORE_KIND
from dare_tf.data.storage.schema import (EXAMPLE_TIME, HIST_CATEGORIES, HIST_ITEMS, HIST_TIME_GAP, STORE_TIMES,
    history_feature)


@public("dare_tf.data")
class SequenceStore:
    """The stored users' click sequences, once: flat int32 `items` and
    `categories` `[C]`, and per dense user id its `start` in them (int64) and
    `length` (0 for users not stored, or not in the partitions loaded).

    A dataset's further fields (`dare_tf.data.storage.fields`): `fields`, each column
    field's flat int32 values `[C]` (`targets`: those with a target value, not
    history-only); with the time gap, `times` (int64 `[C]`) and its bucket
    `edges`."""

    def __init__(self, items: np.ndarray, categories: np.ndarray, start: np.ndarray, length: np.ndarray,
                 fields: dict | None = None, times: np.ndarray | None = None, edges=None, targets=None):
        self.items, self.categories, self.start, self.length = items, categories, start, length
        self.fields, self.times = dict(fields or {}), times
        self.click_times = times  # (every click's time, where `load` was asked for them)
        self.targets = tuple(self.fields if targets is None else targets)
        self.edges = None if edges is None else np.asarray(edges, np.int64)
        self._tensors = None  # TensorFlow copies, made once by dare_tf.data.feeding.pipeline

    @property
    def nbytes(self) -> int:
        arrays = (self.items, self.categories, self.start, self.length, *self.fields.values(),
                  *(() if self.times is None else (self.times,)))
        return sum(a.nbytes for a in arrays)

    @classmethod
    def load(cls, data_dir: str, spec: DatasetSpec, partitions=None, click_times: bool = False) -> "SequenceStore":
        """The store shards of `partitions` (indices; default all); `click_times`:
        also every click's time (`click_times`, int64 `[C]`; None where the dataset
        was prepared before the store kept them), which training without the time
        gap does not hold."""
        names = spec.shard_files(STORE_KIND, partitions)
        parts = read_shards(data_dir, names, spec, STORE_KIND)
        uid = np.concatenate([p["uid"] for p in parts]).astype(np.int64)
        lengths = np.concatenate([p["length"] for p in parts]).astype(np.int64)
        items = np.concatenate([p["items"] for p in parts])
        categories = np.concatenate([p["categories"] for p in parts])
        expected = sum(int(spec.files[n].get("clicks", 0)) for n in names)
        if len(items) != lengths.sum() or len(items) != expected:
            raise ShardError(f"{data_dir}: the store shards {names[:3]}... hold {len(items)} clicks for lengths "
                             f"summing to {int(lengths.sum())}; spec.json records {expected}")
        start = np.zeros(spec.num_users, np.int64)
        length = np.zeros(spec.num_users, np.int32)
        start[uid] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        length[uid] = lengths
        schema = spec.field_schema
        names = schema.columns
        times = np.concatenate([p[STORE_TIMES] for p in parts]) if (schema.time_gap or click_times) and \
            spec.store_times else None
        store = cls(items, categories, start, length, {n: np.concatenate([p[n] for p in parts]) for n in names},
                    times if schema.time_gap else None, schema.edges,
                    [n for n in names if not spec.field(n)["history_only"]])
        store.click_times = times
        return store

    def click_rows(self) -> tuple[list[str], np.ndarray]:
        """Every history feature's name and, int32 `[C + 1, F]`, each click's values
        side by side with a last row of zeros (a padded slot's): a window is one
        gather of rows (`dare_tf.data.feeding.pipeline`, `dare_tf.training.engines.jax.device_input`)."""
        names = [HIST_ITEMS, HIST_CATEGORIES, *map(history_feature, self.fields)]
        columns = [self.items, self.categories, *self.fields.values()]
        clicks = np.zeros((len(self.items) + 1, len(columns)), np.int32)
        for j, column in enumerate(columns):
            clicks[:-1, j] = column
        return names, clicks

    def _window(self, uid, position, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """`[N, max_len]` indices into the flat arrays of the most recent `max_len`
        clicks of user `uid[n]` before its click `position[n]`, and where they exist."""
        check_max_len(max_len)
        uid, position = np.asarray(uid, np.int64), np.asarray(position, np.int64)
        rel = position[:, None] + np.arange(-max_len, 0)[None, :]
        valid = rel >= 0
        return np.where(valid, self.start[uid][:, None] + rel, 0), valid

    def windows(self, uid, position, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """`[N, max_len]` items and categories: the most recent `max_len` clicks
        of user `uid[n]` before its click `position[n]`, left-padded with 0."""
        idx, valid = self._window(uid, position, max_len)
        return np.where(valid, self.items[idx], 0), np.where(valid, self.categories[idx], 0)

    def histories(self, columns: dict, max_len: int, chunk: int = 1 << 16) -> dict[str, np.ndarray]:
        """Every history input (int32 `[N, max_len]`: items, categories, each further
        field's and the time gap's) of the examples `columns` (`uid`, `position`,
        and `time` with the time gap), as `dare_tf.data.feeding.pipeline` assembles them:
        `chunk` examples at a time, so that memory beyond the result stays bounded."""
        n = len(columns["uid"])
        if n <= chunk:
            return self._histories(columns, max_len)
        out = {}
        for start in range(0, n, chunk):
            part = self._histories({k: v[start: start + chunk] for k, v in columns.items()}, max_len)
            for k, v in part.items():
                out.setdefault(k, np.empty((n, max_len), np.int32))[start: start + len(v)] = v
        return out

    def _histories(self, columns: dict, max_len: int) -> dict[str, np.ndarray]:
        from dare_tf.data.storage.fields import time_gap_buckets

        idx, valid = self._window(columns["uid"], columns["position"], max_len)
        out = {HIST_ITEMS: self.items[idx], HIST_CATEGORIES: self.categories[idx],
               **{history_feature(n): v[idx] for n, v in self.fields.items()}}
        if self.times is not None:
            gaps = np.asarray(columns[EXAMPLE_TIME], np.int64)[:, None] - self.times[idx]
            out[HIST_TIME_GAP] = time_gap_buckets(gaps, self.edges)
        return {k: np.where(valid, v, 0).astype(np.int32) for k, v in out.items()}


def check_max_len(max_len) -> None:
    if not isinstance(max_len, (int, np.integer)) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer (the history length L), got {max_len!r}")


@public("dare_tf.data")
def read_examples(data_dir: str, split: str, spec: DatasetSpec, store: SequenceStore | None = None,
                  partitions=None) -> dict[str, np.ndarray]:
    """The split's example columns (int32 `[N]`) of `partitions` (default all),
    in file order; with `store`, checked against it (every example's user is
    stored, its position within the user's sequence)."""
    if split not in spec.shards:
        raise KeyError(f"{os.path.join(data_dir, 'spec.json')}: no split {split!r}; splits: {sorted(spec.shards)}")
    names = spec.shard_files(split, partitions)
    parts = read_shards(data_dir, names, spec, split)
    columns = {k: np.concatenate([p[k] for p in parts]) for k in spec.record_columns[0]}
    if store is not None:
        check_positions(columns, store, f"{data_dir}: {split} ")
    return columns


def check_positions(columns: dict[str, np.ndarray], store: SequenceStore, where: str) -> None:
    """Every example of `columns` points within its user's stored sequence; else a
    ShardError naming the first that does not, after `where` (the file or split)."""
    if not len(columns["uid"]):
        return
    bad = np.flatnonzero(columns["position"] > store.length[columns["uid"]])
    if len(bad):
        raise ShardError(f"{where}example {int(bad[0])} (user {int(columns['uid'][bad[0]])}) points past its "
                         "user's stored sequence: store and examples do not match")


_CACHE: dict[tuple, SequenceStore] = {}


def load_store(data_dir: str, spec: DatasetSpec, partitions=None) -> SequenceStore:
    """The dataset's store (of `partitions`), read once per process."""
    key = (os.path.realpath(data_dir), spec.preparation, None if partitions is None else tuple(partitions))
    if key not in _CACHE:
        _CACHE.clear()  # one dataset's store at a time
        _CACHE[key] = SequenceStore.load(data_dir, spec, partitions)
    return _CACHE[key]


__all__ = ["SequenceStore", "ShardError", "check_max_len", "check_positions", "load_store", "read_examples"]
