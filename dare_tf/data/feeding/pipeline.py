"""tf.data input pipeline: a prepared dataset's TFRecord examples and sequence
store -> the model's input dict, with each history assembled at the chosen
length L.

Two ways to read a split, the same examples and the same batches' content:

- streamed (`stream`, `make_dataset`): the example shards are read by
  `tf.data.TFRecordDataset` and parsed many records at a time
  (`tf.io.parse_example`); shuffled, in blocks of consecutive records
  interleaved over files and shuffled through a buffer, then example by
  example within groups of blocks (`shuffled_columns`); no split has to fit
  in memory;
- cached (`dare_tf.data.feeding.memory.InMemorySplit`, `memory_batches`): a
  split's example columns (20 bytes per example) are read once into memory; an
  epoch is then a uniform permutation, and skipping to a step costs nothing.
Either way, a batch then gathers, per example, the last L clicks of its
user before the cut-off position from the store (the users' sequences,
held in memory once: all partitions, or a worker's own): `[B, L]` reads,
whatever L is, no per-example copy of any history.

Every shard is checked once per process before it is first read
(`dare_tf.data.storage.records.read_shard`: size, sha256, records, id ranges).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from dare_tf._faces import public
from dare_tf.data.storage.fields import time_gap_buckets_tensor
from dare_tf.data.storage.records import feature_spec, verify_shards
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.shards import DEFAULT_SHUFFLE_BUFFER, STREAM_BLOCK, STREAM_MIX_BLOCKS
from dare_tf.data.storage.schema import (EXAMPLE_TIME, HIST_TIME_GAP, TARGET_CATEGORY,
    TARGET_ITEM, USER, target_feature)
from dare_tf.data.storage.store import SequenceStore, check_max_len, load_store


def _store_tensors(store: SequenceStore) -> dict[str, tf.Tensor]:
    """The store's arrays as tensors, made once per store (every split and every
    evaluation's dataset share them): `clicks`, int32 `[C + 1, F]`, every history
    feature's value of each click side by side (`names`, the features' order)
    and a last row of zeros (a padded position's), so that a window is one
    gather; `start`; with the time gap, `times` (`[C + 1]`) and `edges`."""
    if getattr(store, "_tensors", None) is None:
        names, clicks = store.click_rows()
        tensors = {"clicks": tf.constant(clicks), "names": names, "start": tf.constant(store.start)}
        del clicks
        if store.times is not None:
            tensors.update(times=tf.constant(np.append(store.times, 0)), edges=tf.constant(store.edges))
        store._tensors = tensors
    return store._tensors


def assemble_fn(store: SequenceStore, max_len: int):
    """`columns -> (features, label)`: int `[B]` example columns (uid, position,
    target_item, target_category, label, and a dataset's further fields'
    `target_<name>` and `time`) to the model's features (int32, the histories
    `[B, max_len]`, `hist_time_gap` the bucket of each behaviour's time gap,
    `dare_tf.data.storage.fields`) and the float32 label."""
    tensors = _store_tensors(store)
    offsets = tf.range(-max_len, 0, dtype=tf.int64)
    padding = tf.constant(len(store.items), tf.int64)  # the zero row of `clicks`

    def assemble(c):
        uid = tf.cast(c["uid"], tf.int64)
        rel = tf.cast(c["position"], tf.int64)[:, None] + offsets[None, :]
        valid = rel >= 0
        idx = tf.where(valid, tf.gather(tensors["start"], uid)[:, None] + rel, padding)
        windows = tf.unstack(tf.gather(tensors["clicks"], idx), len(tensors["names"]), axis=-1)
        features = {USER: tf.cast(uid, tf.int32), TARGET_ITEM: tf.cast(c["target_item"], tf.int32),
                     TARGET_CATEGORY: tf.cast(c["target_category"], tf.int32),
                     **dict(zip(tensors["names"], windows)),
                     **{target_feature(n): tf.cast(c[target_feature(n)], tf.int32) for n in store.targets}}
        if store.times is not None:
            gaps = tf.cast(c[EXAMPLE_TIME], tf.int64)[:, None] - tf.gather(tensors["times"], idx)
            buckets = time_gap_buckets_tensor(gaps, tensors["edges"])
            features[HIST_TIME_GAP] = tf.where(valid, tf.cast(buckets, tf.int32), 0)
        return features, tf.cast(c["label"], tf.float32)
    return assemble


def memory_batches(split, order: np.ndarray, batch_size: int) -> tf.data.Dataset:
    """`InMemorySplit.batches` in tf.data (`split`, a `dare_tf.data.feeding.memory.InMemorySplit`):
    the split's columns as tensors (made once per split), gathered by `order`'s
    batches and assembled (`assemble_fn`)."""
    if split._tensors is None:
        split._tensors = {k: tf.constant(v) for k, v in split.columns.items()}
    columns, assemble = split._tensors, assemble_fn(split.store, split.max_len)
    ds = tf.data.Dataset.from_tensor_slices(np.asarray(order, np.int64))
    ds = ds.batch(batch_size, drop_remainder=len(order) % batch_size == 0)
    return ds.map(lambda i: assemble({k: tf.gather(v, i) for k, v in columns.items()}),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def shuffled_columns(files: tf.data.Dataset, read, parse, shuffle_buffer: int, seed: int, repeat: bool,
                     deterministic: bool) -> tf.data.Dataset:
    """The example columns of `files` (in that order, each read by `read` into
    serialized records), shuffled: each file in blocks of `STREAM_BLOCK`
    consecutive records, parsed at once by `parse`; up to 8 files interleaved
    block by block; the blocks shuffled through a buffer of `shuffle_buffer`
    examples; the examples of every `STREAM_MIX_BLOCKS` blocks drawn permuted
    (stateless, from `seed` and the group's count: one order per seed, epoch
    after epoch when `repeat`). Elements are columns of up to
    `STREAM_BLOCK * STREAM_MIX_BLOCKS` examples, to be `rebatch`ed."""
    blocks = files.interleave(lambda f: read(f).batch(STREAM_BLOCK).map(parse), cycle_length=8, block_length=1,
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    blocks = blocks.shuffle(max(1, shuffle_buffer // STREAM_BLOCK), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        blocks = blocks.repeat()
    groups = tf.data.Dataset.zip(blocks.ragged_batch(STREAM_MIX_BLOCKS), tf.data.Dataset.counter())

    def mix(columns, count):
        flat = {k: v.flat_values for k, v in columns.items()}  # (a file's last block is shorter)
        order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(flat["label"])[0]),
                                                          seed=tf.stack([tf.constant(seed, tf.int64), count]))
        return {k: tf.gather(v, order) for k, v in flat.items()}

    return groups.map(mix, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)


def stream(data_dir: str, split: str, batch_size: int, *, spec: DatasetSpec | None = None,
           partitions=None, shuffle: bool = False, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
           repeat: bool = False, drop_remainder: bool = False, deterministic: bool = False,
           seed: int | None = None, max_len: int | None = None) -> tf.data.Dataset:
    """`(features, label)` batches of a split's examples (of `partitions`, default
    all), read from its TFRecord shards: in file order, or shuffled (the
    files' order, then blocks of records through a buffer of `shuffle_buffer`
    examples, then the examples of each group of blocks: `shuffled_columns`)."""
    spec = spec or DatasetSpec.load(data_dir)
    max_len = spec.max_len if max_len is None else max_len
    check_max_len(max_len)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if split not in spec.shards:
        raise KeyError(f"{os.path.join(data_dir, 'spec.json')}: no split {split!r}; splits: {sorted(spec.shards)}")
    names = spec.shard_files(split, partitions)
    store = load_store(data_dir, spec, partitions)
    verify_shards(data_dir, spec, names)
    if deterministic and shuffle and seed is None:
        seed = 0
    files = tf.data.Dataset.from_tensor_slices([os.path.join(data_dir, n) for n in names])
    read = lambda f: tf.data.TFRecordDataset(f, compression_type=spec.compression, buffer_size=1 << 18)  # noqa: E731
    features, assemble = feature_spec(split, spec), assemble_fn(store, max_len)
    parse = lambda s: tf.io.parse_example(s, features)  # noqa: E731
    if shuffle:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        ds = shuffled_columns(files.shuffle(len(names), seed=seed), read, parse, shuffle_buffer, seed, repeat,
                              deterministic)
        ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(assemble, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    else:  # file order
        ds = files.flat_map(read)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(lambda s: assemble(parse(s)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    options = tf.data.Options()
    options.deterministic = deterministic
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


@public("dare_tf.data")
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
    partitions=None,
) -> tf.data.Dataset:
    """Batches of `(features, label)` from a prepared dataset's split, streamed
    from its TFRecord shards.

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
        partitions: read only these partitions (shard indices); default all.
    """
    return stream(data_dir, split, batch_size, spec=spec, partitions=partitions,
                  shuffle=split == "train" if shuffle is None else shuffle, shuffle_buffer=shuffle_buffer,
                  repeat=repeat, drop_remainder=drop_remainder, deterministic=deterministic, seed=seed,
                  max_len=max_len)
