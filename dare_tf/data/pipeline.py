"""tf.data input pipeline: a prepared dataset's examples and sequence store ->
the model's input dict, with each history assembled at the chosen length L.

The examples (a few int32 columns) and the store (each user's clicks once)
are held in memory; a batch gathers its examples' columns and then, per
example, the last L clicks of its user before the cut-off position: `[B, L]`
reads from the store, whatever L is (no per-example copy of any history).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dare_tf.data.spec import (HIST_CATEGORIES, HIST_ITEMS, LABEL, TARGET_CATEGORY, TARGET_ITEM, USER,
                               DatasetSpec)
from dare_tf.data.store import SequenceStore, check_max_len, load_store, read_examples

DEFAULT_SHUFFLE_BUFFER = 100_000


def _store_tensors(store: SequenceStore) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The store's arrays as tensors, made once per store (every split and every
    evaluation's dataset share them)."""
    if getattr(store, "_tensors", None) is None:
        store._tensors = (tf.constant(store.items), tf.constant(store.categories), tf.constant(store.start))
    return store._tensors


class InMemorySplit:
    """A split's examples and the store they point into.

    `batches(order, batch_size)` yields `(features, label)` batches of the
    examples `order` (indices): a shuffled epoch is a permutation of
    `range(N)` (a uniform shuffle, no buffer to fill) and skipping to a step
    costs nothing. `stream(...)` shuffles through a buffer instead.
    Features are int32 `uid`, `target_item`, `target_category` `[B]` and
    `hist_items`, `hist_categories` `[B, max_len]`; the label is float32 `[B]`.
    `features` holds every example's features as numpy arrays (materialised on
    first use: `N x max_len` per history feature, for analyses at moderate L).
    """

    def __init__(self, columns: dict[str, np.ndarray], store: SequenceStore, max_len: int):
        check_max_len(max_len)
        self.columns, self.store, self.max_len = columns, store, int(max_len)
        self.labels = columns["label"].astype(np.float32)
        self._features = None
        self._tensors = None

    def __len__(self) -> int:
        return len(self.labels)

    @staticmethod
    def estimated_bytes(spec: DatasetSpec, split: str) -> int:
        """Memory of the split's columns (the store is shared by all splits)."""
        return spec.counts[split] * 4 * 5

    @classmethod
    def load(cls, data_dir: str, split: str, spec: DatasetSpec | None = None,
             max_len: int | None = None) -> "InMemorySplit":
        spec = spec or DatasetSpec.load(data_dir)
        store = load_store(data_dir, spec)
        columns = read_examples(data_dir, split, spec, store)
        if not len(columns["uid"]):
            raise ValueError(f"{data_dir}: the {split} split has no examples")
        return cls(columns, store, spec.max_len if max_len is None else max_len)

    @property
    def features(self) -> dict[str, np.ndarray]:
        if self._features is None:
            c = self.columns
            items, categories = self.store.windows(c["uid"], c["position"], self.max_len)
            self._features = {USER: c["uid"], TARGET_ITEM: c["target_item"], TARGET_CATEGORY: c["target_category"],
                              HIST_ITEMS: items.astype(np.int32), HIST_CATEGORIES: categories.astype(np.int32)}
        return self._features

    def _assemble(self):
        """`indices [B] -> (features, label)` in TensorFlow."""
        if self._tensors is None:
            c = self.columns
            self._tensors = (
                {k: tf.constant(c[k]) for k in ("uid", "position", "target_item", "target_category")},
                tf.constant(self.labels))
        columns, labels = self._tensors
        items, categories, start = _store_tensors(self.store)
        offsets = tf.range(-self.max_len, 0, dtype=tf.int64)

        def assemble(i):
            uid = tf.gather(columns["uid"], i)
            rel = tf.cast(tf.gather(columns["position"], i), tf.int64)[:, None] + offsets[None, :]
            valid = rel >= 0
            idx = tf.where(valid, tf.gather(start, uid)[:, None] + rel, 0)
            features = {USER: uid, TARGET_ITEM: tf.gather(columns["target_item"], i),
                        TARGET_CATEGORY: tf.gather(columns["target_category"], i),
                        HIST_ITEMS: tf.where(valid, tf.gather(items, idx), 0),
                        HIST_CATEGORIES: tf.where(valid, tf.gather(categories, idx), 0)}
            return features, tf.gather(labels, i)
        return assemble

    def batches(self, order: np.ndarray, batch_size: int) -> tf.data.Dataset:
        """`(features, label)` batches of the examples `order` (indices), in that
        order; when `len(order)` is a multiple of `batch_size`, the batch
        dimension is static."""
        ds = tf.data.Dataset.from_tensor_slices(np.asarray(order, np.int64))
        ds = ds.batch(batch_size, drop_remainder=len(order) % batch_size == 0)
        return ds.map(self._assemble(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def stream(self, batch_size: int, *, shuffle: bool, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
               repeat: bool = False, drop_remainder: bool = False, deterministic: bool = False,
               seed: int | None = None) -> tf.data.Dataset:
        """Batches in file order, or shuffled through a buffer of `shuffle_buffer`."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if deterministic and shuffle and seed is None:
            seed = 0
        ds = tf.data.Dataset.range(len(self))
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(self._assemble(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        options = tf.data.Options()
        options.deterministic = deterministic
        return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def make_dataset(
    data_dir: str,
    split: str,
    batch_size: int,
    *,
    shuffle: bool | None = None,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    repeat: bool = False,
    drop_remainder: bool = False,
    deterministic: bool = False,
    seed: int | None = None,
    spec: DatasetSpec | None = None,
    max_len: int | None = None,
) -> tf.data.Dataset:
    """Batches of `(features, label)` from a prepared dataset's split.

    Args:
        data_dir: a directory written by `python -m data.prepare`.
        split: `train`, `val` or `test`.
        batch_size: examples per batch.
        shuffle: shuffle the examples (through a buffer of `shuffle_buffer`);
            defaults to True for `train` only.
        repeat: repeat forever.
        drop_remainder: drop the last partial batch.
        deterministic: the same order on every run (with `seed`), at some
            cost in parallelism.
        seed: shuffling seed.
        spec: the dataset's spec, if already loaded.
        max_len: history length L of the assembled windows; defaults to the
            dataset's (`spec.json`). Longer than a user's history: left-padded.
    """
    return InMemorySplit.load(data_dir, split, spec, max_len).stream(
        batch_size, shuffle=split == "train" if shuffle is None else shuffle, shuffle_buffer=shuffle_buffer,
        repeat=repeat, drop_remainder=drop_remainder, deterministic=deterministic, seed=seed)
