"""Training and evaluation throughput, and dense Adam vs LazyAdam at Taobao's vocabulary.

Usage: python benchmarks/bench_train.py [--quick] [--parts presets,vocabulary]
                                        [--auc_data_dir DIR] [--json PATH]

Part 1: train-step (forward, backward, Adam update) and evaluation samples/s
  of every preset at the reference configuration (L=200, K=20, d=16), batch
  256 and 2048, XLA on and off, on a 50k-item vocabulary (the size of the
  3,000-user log the issue's PyTorch baseline figures were taken on).
Part 2: DARE train steps at Taobao's real vocabulary (4,068,791 items,
  9,408 categories) with dense Adam (reference) and LazyAdam, batch 256
  and 2048, beside the same at 1M and 50k items: a step should cost the
  same whatever the vocabulary.
Part 3 (with --auc_data_dir): test AUC of DARE trained with each optimizer
  on a prepared dataset (same seed and schedule).
Inputs are random in-memory batches, so the input pipeline is not timed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dare_tf  # noqa: E402
from benchmarks.common import print_table, selected_parts, time_call, write_json  # noqa: E402
from dare_tf.training import make_optimizer, make_train_step  # noqa: E402

TAOBAO_ITEMS, TAOBAO_CATEGORIES = 4_068_791, 9_408
SMALL_ITEMS, SMALL_CATEGORIES = 50_000, 1_000


def batch(rng, size, num_items, num_categories, length=200):
    return ({"target_item": tf.constant(rng.integers(1, num_items, size), tf.int32),
             "target_category": tf.constant(rng.integers(1, num_categories, size), tf.int32),
             "hist_items": tf.constant(rng.integers(1, num_items, (size, length)), tf.int32),
             "hist_categories": tf.constant(rng.integers(1, num_categories, (size, length)), tf.int32)},
            tf.constant(rng.integers(0, 2, size), tf.float32))


def bench_presets(rng, sizes, min_seconds):
    rows = []
    for preset in sorted(dare_tf.PRESETS):
        model = dare_tf.build_model(preset, SMALL_ITEMS, SMALL_CATEGORIES, max_len=200, top_k=20, seed=0)
        for size in sizes:
            x, y = batch(rng, size, SMALL_ITEMS, SMALL_CATEGORIES)
            row = {"preset": preset, "batch": size}
            for jit in (False, True):
                step = make_train_step(model, make_optimizer("adam", 0.01), jit_compile=jit)
                row["train_xla" if jit else "train"] = size / time_call(lambda: step(x, y), min_seconds)
                predict = tf.function(lambda inputs: model(inputs, training=False), jit_compile=jit)
                row["eval_xla" if jit else "eval"] = size / time_call(lambda: predict(x), min_seconds)
            rows.append(row)
            print(f"  {preset} batch={size}: {row}", flush=True)
    return rows


def bench_vocab(rng, sizes, min_seconds):
    rows = []
    for items, cats, label in ((SMALL_ITEMS, SMALL_CATEGORIES, "50k items"),
                               (1_000_000, TAOBAO_CATEGORIES, "1M items"),
                               (TAOBAO_ITEMS, TAOBAO_CATEGORIES, "Taobao 4.07M items")):
        model = dare_tf.build_model("dare", items, cats, max_len=200, top_k=20, seed=0)
        for name in ("adam", "lazy_adam"):
            for size in sizes:
                x, y = batch(rng, size, items, cats)
                step = make_train_step(model, make_optimizer(name, 0.01), jit_compile=True)
                rate = size / time_call(lambda: step(x, y), min_seconds)
                rows.append({"vocabulary": label, "optimizer": name, "batch": size, "train_samples_per_s": rate})
                print(f"  {label} {name} batch={size}: {rate:.0f}/s", flush=True)
        del model
    return rows


def bench_auc(data_dir, work_dir):
    from dare_tf.training import TrainConfig, train
    rows = []
    for optimizer in ("adam", "lazy_adam"):
        config = TrainConfig(preset="dare", optimizer=optimizer, batch_size=512, eval_batch_size=2048, epochs=1,
                             eval_every=60, learning_rate=0.005, seeds=(0, 1))
        run_dir = os.path.join(work_dir, optimizer)
        # train() reuses finished seeds of a run directory: start clean so that no result
        # of an earlier benchmark (or an earlier version of the code) is reported.
        shutil.rmtree(run_dir, ignore_errors=True)
        results = train(data_dir, run_dir, config)
        rows.append({"optimizer": optimizer, "test_auc": results["test"]["auc"],
                     "test_auc_std": results["test_std"]["auc"], "test_gauc": results["test"]["gauc"]})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="presets,vocabulary",
                        help="comma-separated parts to run: presets (part 1), vocabulary (part 2)")
    parser.add_argument("--auc_data_dir", default=None, help="prepared dataset for the optimizer AUC check")
    parser.add_argument("--work_dir", default="/tmp/bench_train_runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    min_seconds = 0.5 if args.quick else 2.0
    sizes = [256] if args.quick else [256, 2048]
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs")
    parts = selected_parts(parser, args.parts, ("presets", "vocabulary"))
    payload = {}
    if "presets" in parts:
        print("Part 1: samples/s per preset (L=200, K=20, d=16, 50k items; train = forward+backward+Adam)")
        payload["presets"] = bench_presets(rng, sizes, min_seconds)
        print_table(payload["presets"], ["preset", "batch", "train", "train_xla", "eval", "eval_xla"])
    if "vocabulary" in parts:
        print("Part 2: DARE train samples/s by vocabulary and optimizer (XLA)")
        payload["vocabulary"] = bench_vocab(rng, sizes, min_seconds)
        print_table(payload["vocabulary"], ["vocabulary", "optimizer", "batch", "train_samples_per_s"])
    if args.auc_data_dir:
        print("Part 3: test AUC of DARE with each optimizer (2 seeds)")
        payload["optimizer_auc"] = bench_auc(args.auc_data_dir, args.work_dir)
        print_table(payload["optimizer_auc"], ["optimizer", "test_auc", "test_auc_std", "test_gauc"])
    write_json("bench_train", payload, args.json)


if __name__ == "__main__":
    main()
