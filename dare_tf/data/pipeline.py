"""tf.data input pipeline: prepared TFRecord shards -> the model's input dict."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dare_tf.data.spec import LABEL, SCALAR_FEATURES, SEQUENCE_FEATURES, DatasetSpec

DEFAULT_SHUFFLE_BUFFER = 100_000


def feature_spec(max_len: int) -> dict[str, tf.io.FixedLenFeature]:
    spec = {name: tf.io.FixedLenFeature([], tf.int64) for name in SCALAR_FEATURES}
    spec.update({name: tf.io.FixedLenFeature([max_len], tf.int64) for name in SEQUENCE_FEATURES})
    return spec


def parse_batch(serialized: tf.Tensor, max_len: int) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """Parses a batch of serialized examples into (features, label).

    Features are int32 `target_item`, `target_category`, `uid` `[B]` and
    `hist_items`, `hist_categories` `[B, max_len]`; the label is float32 `[B]`.
    """
    parsed = tf.io.parse_example(serialized, feature_spec(max_len))
    label = tf.cast(parsed.pop(LABEL), tf.float32)
    return {k: tf.cast(v, tf.int32) for k, v in parsed.items()}, label


def make_dataset(
    data_dir: str,
    split: str,
    batch_size: int,
    *,
    shuffle: bool | None = None,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    repeat: bool = False,
    cache: bool = False,
    drop_remainder: bool = False,
    deterministic: bool = False,
    seed: int | None = None,
    spec: DatasetSpec | None = None,
) -> tf.data.Dataset:
    """Batches of `(features, label)` from a prepared dataset's split.

    Args:
        data_dir: a directory written by `python -m data.prepare`.
        split: `train`, `val` or `test`.
        batch_size: examples per batch.
        shuffle: shuffle shard order and examples (a buffer of
            `shuffle_buffer`); defaults to True for `train` only.
        repeat: repeat forever.
        cache: keep the serialized examples in memory after the first pass.
        drop_remainder: drop the last partial batch.
        deterministic: the same order on every run (with `seed`), at some
            cost in parallelism.
        seed: shuffling seed.
        spec: the dataset's spec, if already loaded.
    """
    spec = spec or DatasetSpec.load(data_dir)
    files = spec.shard_paths(data_dir, split)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    shuffle = split == "train" if shuffle is None else shuffle
    if deterministic and shuffle and seed is None:
        seed = 0
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle and len(files) > 1:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if cache:
        ds = ds.cache()
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = ds.map(lambda s: parse_batch(s, spec.max_len), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=deterministic)
    options = tf.data.Options()
    options.deterministic = deterministic
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


class InMemorySplit:
    """A split decoded once into memory: int32 feature arrays (`[N]` scalars,
    `[N, L]` histories) and float32 labels `[N]`, in the split's file order.

    `batches(order, batch_size)` gathers batches by index, so a shuffled epoch
    is a permutation of `range(N)` (a uniform shuffle, no buffer to fill, no
    parsing per step) and skipping to a step costs nothing.
    """

    def __init__(self, features: dict[str, np.ndarray], labels: np.ndarray):
        self.features = features
        self.labels = labels
        self._tensors = None

    def __len__(self) -> int:
        return len(self.labels)

    @staticmethod
    def estimated_bytes(spec: DatasetSpec, split: str) -> int:
        per_example = 4 * (len(SCALAR_FEATURES) + len(SEQUENCE_FEATURES) * spec.max_len)
        return spec.counts[split] * per_example

    @classmethod
    def load(cls, data_dir: str, split: str, spec: DatasetSpec | None = None) -> "InMemorySplit":
        parts = list(make_dataset(data_dir, split, 16384, shuffle=False, deterministic=True,
                                  spec=spec).as_numpy_iterator())
        if not parts:
            raise ValueError(f"{data_dir}: the {split} split has no examples")
        features = {k: np.concatenate([x[k] for x, _ in parts]) for k in parts[0][0]}
        return cls(features, np.concatenate([y for _, y in parts]))

    def batches(self, order: np.ndarray, batch_size: int) -> tf.data.Dataset:
        """`(features, label)` batches of the examples `order` (indices), in that
        order; when `len(order)` is a multiple of `batch_size`, the batch
        dimension is static."""
        if self._tensors is None:
            self._tensors = ({k: tf.constant(v) for k, v in self.features.items()}, tf.constant(self.labels))
        features, labels = self._tensors
        ds = tf.data.Dataset.from_tensor_slices(np.asarray(order, np.int64))
        ds = ds.batch(batch_size, drop_remainder=len(order) % batch_size == 0)
        return ds.map(lambda i: ({k: tf.gather(v, i) for k, v in features.items()}, tf.gather(labels, i)),
                      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
