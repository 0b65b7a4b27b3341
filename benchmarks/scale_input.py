"""bench_scale's `input` phase, in a process of its own (the caller pins it to one
core with `taskset`, or not): the trainer's streamed input, a prepared
dataset's training split read from its TFRecord shards, shuffled, parsed and
its windows assembled (`dare_tf.data.feeding.pipeline.make_dataset`, no model), and
each stage of it alone, so that the whole is read against the sum of its parts:

- `read`: the shards' records (GZIP inflated), counted;
- `parse`: read, batched and `tf.io.parse_example`d into the example columns;
- `assemble`: the parsed columns of one batch held in memory, assembled into the
  `[B, L]` windows again and again (the store gather alone);
- `pipeline`: all of it, as the trainer reads it (blocks of records parsed and
  shuffled as units, then the examples of groups of blocks permuted);
- `record_shuffle` (the baseline, what `make_dataset` did before): the same files
  interleaved record by record, shuffled record by record through a buffer of
  `DEFAULT_SHUFFLE_BUFFER`, then batched, parsed and assembled.

The bound of the pipeline on this core is `1 / (1/read + 1/parse-only + 1/assemble)`
(each stage at its own rate, nothing lost between them). Prints one JSON line.

Usage: python benchmarks/scale_input.py DATA_DIR [--batch 2048] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def rate(dataset, seconds: float, per_element: int) -> float:
    """Elements x `per_element` per second of `dataset` (repeated), after a warm-up."""
    it = iter(dataset)
    for _ in range(3):
        next(it)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(it)
        count += 1
    return count * per_element / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    import tensorflow as tf

    from dare_tf.data.feeding.pipeline import assemble_fn, make_dataset
    from dare_tf.data.storage.records import feature_spec
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.shards import DEFAULT_SHUFFLE_BUFFER
    from dare_tf.data.storage.store import load_store

    spec = DatasetSpec.load(args.data_dir)
    names = spec.shard_files("train")
    paths = [os.path.join(args.data_dir, n) for n in names]
    records = sum(spec.records(n) for n in names)
    compressed = sum(os.path.getsize(p) for p in paths)
    raw = sum(len(r.numpy()) + 16 for r in tf.data.TFRecordDataset(paths[:1], compression_type=spec.compression))
    raw_per_record = raw / spec.records(names[0])
    read = tf.data.TFRecordDataset(tf.data.Dataset.from_tensor_slices(paths).repeat(),
                                   compression_type=spec.compression, buffer_size=1 << 18)
    read_rate = rate(read.batch(args.batch), args.seconds, args.batch)
    features = feature_spec("train", spec)
    parsed = read.batch(args.batch).map(lambda s: tf.io.parse_example(s, features))
    parse_rate = rate(parsed, args.seconds, args.batch)
    store = load_store(args.data_dir, spec)
    one = next(iter(parsed))
    assemble = tf.function(assemble_fn(store, spec.max_len))
    assemble_rate = rate(tf.data.Dataset.from_tensors(one).repeat().map(assemble), args.seconds, args.batch)
    pipeline = make_dataset(args.data_dir, "train", args.batch, repeat=True, drop_remainder=True)
    pipeline_rate = rate(pipeline, args.seconds, args.batch)
    files = tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths)).repeat()
    interleaved = files.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=spec.compression,
                                                                     buffer_size=1 << 18),
                                   cycle_length=min(len(paths), 8), block_length=64,
                                   num_parallel_calls=tf.data.AUTOTUNE)
    baseline = interleaved.shuffle(DEFAULT_SHUFFLE_BUFFER).batch(args.batch, drop_remainder=True).map(
        lambda s: assemble(tf.io.parse_example(s, features)), num_parallel_calls=tf.data.AUTOTUNE)
    baseline_rate = rate(baseline.prefetch(tf.data.AUTOTUNE), args.seconds, args.batch)
    parse_only = 1 / max(1 / parse_rate - 1 / read_rate, 1e-12)
    bound = 1 / (1 / read_rate + 1 / parse_only + 1 / assemble_rate)
    print("RESULT", json.dumps({
        "cpus": len(os.sched_getaffinity(0)), "batch": args.batch, "train_records": records,
        "gz_bytes_per_example": round(compressed / records, 1), "raw_bytes_per_example": round(raw_per_record, 1),
        "window_bytes_per_example": 4 * spec.max_len * (2 + len(store.fields) + (store.times is not None)),
        "read_per_s": round(read_rate), "read_mb_per_s": round(read_rate * compressed / records / 1e6, 1),
        "parse_per_s": round(parse_rate), "assemble_per_s": round(assemble_rate),
        "pipeline_per_s": round(pipeline_rate), "bound_per_s": round(bound),
        "pipeline/bound": round(pipeline_rate / bound, 2), "record_shuffle_per_s": round(baseline_rate),
        "vs_record_shuffle": round(pipeline_rate / baseline_rate, 2)}))


if __name__ == "__main__":
    main()
