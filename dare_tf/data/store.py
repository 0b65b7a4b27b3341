"""Reading a prepared dataset: the per-user sequence store and the compact
examples (`dare_tf.data.protocol` writes them), and the assembly of each
example's last-L history window. Numpy only; `dare_tf.data.pipeline` does
the same assembly in TensorFlow, a batch at a time.

Every shard is checked when read: its size against `spec.json` (a shorter
file is named as truncated), and the preparation id it records against the
spec's, so a store and examples from different preparations are refused.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from dare_tf.data.spec import EXAMPLE_COLUMNS, STORE_CLICK_COLUMNS, STORE_USER_COLUMNS, DatasetSpec


class ShardError(ValueError):
    """A shard of a prepared dataset is missing, truncated, corrupt or from another preparation."""


def read_shard(data_dir: str, name: str, spec: DatasetSpec, columns) -> dict[str, np.ndarray]:
    """The `columns` of shard `name`, after checking its size and preparation id."""
    path = os.path.join(data_dir, name)
    expected = spec.files.get(name)
    try:
        size = os.path.getsize(path)
    except OSError:
        raise ShardError(f"{path}: shard listed in {os.path.join(data_dir, 'spec.json')} is missing") from None
    if expected is not None and size != expected:
        state = "truncated" if size < expected else "longer than written"
        raise ShardError(f"{path}: shard is {state} ({size} bytes; spec.json records {expected}); "
                         "prepare the dataset again")
    try:
        with np.load(path, allow_pickle=False) as z:
            preparation = str(z["preparation"])
            out = {k: np.asarray(z[k]) for k in columns}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ShardError(f"{path}: shard is corrupt ({type(e).__name__}: {e}); prepare the dataset again") from e
    if preparation != spec.preparation:
        raise ShardError(f"{path}: shard is from preparation {preparation}, but {data_dir}/spec.json "
                         f"(and the rest of the dataset) is preparation {spec.preparation}: the store and "
                         "the examples must come from one run of data.prepare")
    return out


class SequenceStore:
    """Every qualifying user's click sequence, once: flat int32 `items` and
    `categories` `[C]`, and per dense user id its `start` in them (int64) and
    `length` (0 for users not stored)."""

    def __init__(self, items: np.ndarray, categories: np.ndarray, start: np.ndarray, length: np.ndarray):
        self.items, self.categories, self.start, self.length = items, categories, start, length
        self._tensors = None  # TensorFlow copies, made once by dare_tf.data.pipeline

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.items, self.categories, self.start, self.length))

    @classmethod
    def load(cls, data_dir: str, spec: DatasetSpec) -> "SequenceStore":
        parts = [read_shard(data_dir, name, spec, STORE_USER_COLUMNS + STORE_CLICK_COLUMNS) for name in spec.store]
        uid = np.concatenate([p["uid"] for p in parts]).astype(np.int64)
        lengths = np.concatenate([p["length"] for p in parts]).astype(np.int64)
        items = np.concatenate([p["items"] for p in parts])
        categories = np.concatenate([p["categories"] for p in parts])
        if len(items) != lengths.sum() or len(items) != spec.clicks_stored or (uid >= spec.num_users).any():
            raise ShardError(f"{data_dir}: the store's shards hold {len(items)} clicks for lengths summing to "
                             f"{int(lengths.sum())}; spec.json records {spec.clicks_stored}")
        start = np.zeros(spec.num_users, np.int64)
        length = np.zeros(spec.num_users, np.int32)
        start[uid] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        length[uid] = lengths
        return cls(items, categories, start, length)

    def windows(self, uid, position, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """`[N, max_len]` items and categories: the most recent `max_len` clicks
        of user `uid[n]` before its click `position[n]`, left-padded with 0."""
        check_max_len(max_len)
        uid, position = np.asarray(uid, np.int64), np.asarray(position, np.int64)
        rel = position[:, None] + np.arange(-max_len, 0)[None, :]
        valid = rel >= 0
        idx = np.where(valid, self.start[uid][:, None] + rel, 0)
        return np.where(valid, self.items[idx], 0), np.where(valid, self.categories[idx], 0)


def check_max_len(max_len) -> None:
    if not isinstance(max_len, (int, np.integer)) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer (the history length L), got {max_len!r}")


def read_examples(data_dir: str, split: str, spec: DatasetSpec, store: SequenceStore | None = None
                  ) -> dict[str, np.ndarray]:
    """The split's example columns (int32 `[N]`), in file order; with `store`,
    checked against it (every example's user is stored, its position inside
    the user's sequence)."""
    if split not in spec.shards:
        raise KeyError(f"{os.path.join(data_dir, 'spec.json')}: no split {split!r}; splits: {sorted(spec.shards)}")
    parts = [read_shard(data_dir, name, spec, EXAMPLE_COLUMNS) for name in spec.shards[split]]
    columns = {k: np.concatenate([p[k] for p in parts]) for k in EXAMPLE_COLUMNS}
    if len(columns["uid"]) != spec.counts[split]:
        raise ShardError(f"{data_dir}: the {split} shards hold {len(columns['uid'])} examples; spec.json "
                         f"records {spec.counts[split]}")
    if store is not None and len(columns["uid"]):
        bad = np.flatnonzero(columns["position"] >= store.length[columns["uid"]])
        if len(bad):
            raise ShardError(f"{data_dir}: {split} example {int(bad[0])} (user {int(columns['uid'][bad[0]])}) "
                             "points past its user's stored sequence: store and examples do not match")
    return columns


_CACHE: dict[tuple, SequenceStore] = {}


def load_store(data_dir: str, spec: DatasetSpec) -> SequenceStore:
    """The dataset's store, read once per process (per directory and preparation)."""
    key = (os.path.realpath(data_dir), spec.preparation, tuple(spec.store))
    if key not in _CACHE:
        _CACHE.clear()  # one dataset's store at a time
        _CACHE[key] = SequenceStore.load(data_dir, spec)
    return _CACHE[key]


__all__ = ["SequenceStore", "ShardError", "check_max_len", "load_store",
           "read_examples", "read_shard"]
