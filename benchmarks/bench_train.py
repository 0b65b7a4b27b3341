"""Training and evaluation throughput: the Keras train step, vocabularies, the
trainer end to end, and an A/B against an earlier commit.

Usage: python benchmarks/bench_train.py [--backend tensorflow|jax] [--quick] [--batches 256,2048]
           [--parts presets,vocabulary,end_to_end,long,ab] [--long_lengths 200,1000,10000]
           [--baseline_ref REF] [--json PATH]

presets: samples/s of the compiled Keras train step (forward, backward,
  optimizer update; what `model.fit` runs per batch) and of prediction, for
  every preset at the reference configuration (L=200, K=20, d=16), batch 256
  and 2048, 50k items. Inputs are in-memory batches.
vocabulary: DARE train steps at 50k, 1M and Taobao's 4,068,791 items with
  dense Adam and LazyAdam (TensorFlow only).
end_to_end: `trainers.train`'s library call on a generated 1M-row
  Taobao-format log (3,000 users, ~171k training examples): training and
  evaluation samples/s inside the real program, wall time, beside the
  isolated step (the compiled train function on one batch of the same
  dataset, repeated; total time over steps, like the trainer's figure) on
  the same machine in the same run.
long: the whole training step at history length L = 200, 1,000, 10,000
  (`--long_lengths`; 100,000 if asked), each in its own process: batches
  assembled from a sequence store by the real pipeline (`InMemorySplit`),
  then Keras's train function (Adam). DARE with `aux_attention=retrieved`
  (representation and gradients through the K retrieved rows only) beside
  the reference DARE (auxiliary attention over all L slots, full [B, L, D]
  representation). Samples/s, microseconds per behaviour (step time / (B x
  L)), and the process's peak RSS.
ab: the train step of this checkout against `--baseline_ref` (default: the
  last commit before the `model.fit` trainer), each measured in its own
  process, alternating, 3 rounds; medians and ratios.
With `--backend jax` (or KERAS_BACKEND=jax) the presets part runs on JAX
(Keras Adam; no TensorFlow needed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TAOBAO_ITEMS, TAOBAO_CATEGORIES = 4_068_791, 9_408
SMALL_ITEMS, SMALL_CATEGORIES = 50_000, 1_000
BASELINE_REF = "6978cd8"  # the last commit with the hand-written training loop

# Times `rounds` calls of the compiled train step of one configuration; prints samples/s.
STEP_SCRIPT = r"""
import os, sys, time, json
sys.path.insert(0, sys.argv[1])
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
preset, items, cats, batch = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
optimizer, seconds = sys.argv[6], float(sys.argv[7])
import dare_tf
rng = np.random.default_rng(0)
x = {"target_item": rng.integers(1, items, batch).astype("int32"),
     "target_category": rng.integers(1, cats, batch).astype("int32"),
     "hist_items": rng.integers(1, items, (batch, 200)).astype("int32"),
     "hist_categories": rng.integers(1, cats, (batch, 200)).astype("int32")}
y = rng.integers(0, 2, batch).astype("float32")
if len(sys.argv) > 8:  # one batch of a prepared dataset instead of uniform random ids
    from dare_tf.data.feeding.pipeline import make_dataset
    features, labels = next(iter(make_dataset(sys.argv[8], "train", batch, seed=0, deterministic=True)))
    x = {k: features[k].numpy() for k in x}
    y = labels.numpy()
model = dare_tf.build_model(preset, items, cats, max_len=200, top_k=20, seed=0)
import dare_tf.training as training
if hasattr(training, "make_train_step"):  # the hand-written loop's step (baseline commits)
    import tensorflow as tf
    step_fn = training.make_train_step(model, training.make_optimizer(optimizer, 0.01), jit_compile=True)
    xt = {k: tf.constant(v) for k, v in x.items()}; yt = tf.constant(y)
    step = lambda: step_fn(xt, yt)
else:  # Keras's train function, as model.fit runs it (the trainer's settings)
    import tensorflow as tf
    opt = training.make_optimizer(optimizer, 0.01)  # (baseline commits' optimizers lack sparse_gradients)
    model = dare_tf.build_model(preset, items, cats, max_len=200, top_k=20, seed=0,
                                sparse_embedding_gradients=getattr(opt, "sparse_gradients", optimizer == "lazy_adam"))
    model.compile(optimizer=opt)
    model.make_train_function()
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    step = lambda: model.train_function(iterator)
for _ in range(3):
    step()
times = []
start = time.perf_counter()
while time.perf_counter() - start < seconds or len(times) < 5:
    t0 = time.perf_counter(); out = step(); float(out["loss"] if isinstance(out, dict) else out)
    times.append(time.perf_counter() - t0)
mean = batch * len(times) / sum(times)
times.sort()
print(json.dumps({"samples_per_s": batch / times[len(times) // 2], "mean_samples_per_s": mean}))
"""


# One configuration at one history length: the store pipeline's batches into the train function.
LONG_SCRIPT = r"""
import os, sys, json, resource
sys.path.insert(0, sys.argv[1])
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
L, batch, aux, seconds = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
items, cats, users = 50_000, 1_000, 64
import dare_tf
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.store import SequenceStore
import dare_tf.training as training
rng = np.random.default_rng(0)
length = L + 50  # every user has L clicks before the cut-off
store = SequenceStore(rng.integers(1, items, users * length).astype("int32"),
                      rng.integers(1, cats, users * length).astype("int32"),
                      np.arange(users + 1, dtype=np.int64) * length, np.full(users + 1, length, np.int32))
n = 4096
columns = {"uid": rng.integers(0, users, n).astype("int32"), "position": rng.integers(L, length, n).astype("int32"),
           "target_item": rng.integers(1, items, n).astype("int32"),
           "target_category": rng.integers(1, cats, n).astype("int32"),
           "label": rng.integers(0, 2, n).astype("int32")}
split = InMemorySplit(columns, store, L)
model = dare_tf.build_model("dare", items, cats, max_len=L, top_k=20, seed=0, num_positions=L + 1,
                            aux_attention=aux, sparse_embedding_gradients=False)
model.compile(optimizer=training.make_optimizer("adam", 0.01))
model.make_train_function()
order = np.concatenate([rng.permutation(n) for _ in range(200)])
iterator = iter(split.batches(order, batch).map(lambda x, y: ({k: x[k] for k in dare_tf.data.MODEL_INPUTS}, y)))
from benchmarks.common import time_call
median = time_call(lambda: float(model.train_function(iterator)["loss"]), min_seconds=seconds, warmup=3)
print(json.dumps({"samples_per_s": batch / median, "us_per_behaviour": 1e6 * median / (batch * L),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "retrieved_only": model.retrieved_representation_only()}))
"""


def bench_long(lengths, batch, seconds):
    """The train step (store pipeline included) at each L, each configuration in its own process."""
    rows = []
    for aux in ("retrieved", "all"):
        for length in lengths:
            if aux == "all" and length > 10_000:  # [B, L, D] representations of every slot: beyond 24 GB
                continue
            done = subprocess.run([sys.executable, "-c", LONG_SCRIPT, REPO, str(length), str(batch), aux, str(seconds)],
                                  capture_output=True, text=True, cwd=REPO,
                                  env=dict(os.environ, KERAS_BACKEND="tensorflow"))
            if done.returncode:
                rows.append({"model": f"dare aux={aux}", "L": length,
                             "error": done.stderr.strip().splitlines()[-1][:120]})
            else:
                rows.append({"model": f"dare aux={aux}", "L": length, "batch": batch,
                             **json.loads(done.stdout.strip().splitlines()[-1])})
            print(f"  {rows[-1]}", flush=True)
    for row in rows:
        base = next((r for r in rows if r["model"] == row["model"] and r["L"] == 1000
                     and "us_per_behaviour" in r), None)
        if base and "us_per_behaviour" in row:
            row["per_behaviour_vs_L1000"] = row["us_per_behaviour"] / base["us_per_behaviour"]
    return rows


def _step_in_process(root, preset, items, cats, batch, optimizer, seconds, data_dir=None, key="samples_per_s"):
    """Samples/s of the compiled train step in a fresh process: from the median
    step time (`samples_per_s`) or from the total time (`mean_samples_per_s`)."""
    done = subprocess.run([sys.executable, "-c", STEP_SCRIPT, root, preset, str(items), str(cats), str(batch),
                           optimizer, str(seconds), *([data_dir] if data_dir else [])], capture_output=True, text=True,
                          cwd=root,
                          env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])[key]


def bench_ab(baseline_ref, quick, batches):
    """This checkout vs `baseline_ref`, alternating processes, median of 3 rounds."""
    import numpy as np

    worktree = tempfile.mkdtemp(prefix="dare_baseline_")
    subprocess.run(["git", "worktree", "add", "--detach", "-f", worktree, baseline_ref], cwd=REPO, check=True,
                   capture_output=True)
    cases = [("dare", SMALL_ITEMS, SMALL_CATEGORIES, "50k items")]
    if not quick:
        cases.append(("dare", TAOBAO_ITEMS, TAOBAO_CATEGORIES, "Taobao 4.07M items"))
    rows = []
    try:
        for preset, items, cats, label in cases:
            for optimizer in ("adam", "lazy_adam"):
                for batch in batches:
                    rates = {"now": [], "baseline": []}
                    for _ in range(3):
                        for name, root in (("baseline", worktree), ("now", REPO)):
                            rates[name].append(_step_in_process(root, preset, items, cats, batch, optimizer,
                                                                1.0 if quick else 3.0))
                    row = {"vocabulary": label, "optimizer": optimizer, "batch": batch,
                           "baseline": float(np.median(rates["baseline"])), "now": float(np.median(rates["now"]))}
                    row["now/baseline"] = row["now"] / row["baseline"]
                    rows.append(row)
                    print(f"  {row}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", worktree], cwd=REPO, capture_output=True)
        shutil.rmtree(worktree, ignore_errors=True)
    return rows


def bench_presets(sizes, min_seconds):
    import keras
    import numpy as np

    import dare_tf
    from benchmarks.common import time_call

    rng = np.random.default_rng(0)
    tf_backend = keras.backend.backend() == "tensorflow"
    rows = []
    for preset in sorted(dare_tf.PRESETS):
        for size in sizes:
            x = {"target_item": rng.integers(1, SMALL_ITEMS, size).astype("int32"),
                 "target_category": rng.integers(1, SMALL_CATEGORIES, size).astype("int32"),
                 "hist_items": rng.integers(1, SMALL_ITEMS, (size, 200)).astype("int32"),
                 "hist_categories": rng.integers(1, SMALL_CATEGORIES, (size, 200)).astype("int32")}
            y = rng.integers(0, 2, size).astype("float32")
            model = dare_tf.build_model(preset, SMALL_ITEMS, SMALL_CATEGORIES, max_len=200, top_k=20, seed=0,
                                        sparse_embedding_gradients=False)
            if tf_backend:
                from dare_tf.optimizers import FusedAdam

                optimizer = FusedAdam(0.01)
            else:
                optimizer = keras.optimizers.Adam(0.01)
            model.compile(optimizer=optimizer)
            row = {"preset": preset, "batch": size, "backend": keras.backend.backend(), "device": _device()}
            # model.fit's own step: one batch per call (train_on_batch runs the same train function).
            row["train"] = size / time_call(lambda: model.train_on_batch(x, y), min_seconds)
            row["predict"] = size / time_call(lambda: model.predict_on_batch(x), min_seconds)
            rows.append(row)
            print(f"  {row}", flush=True)
    return rows


def _device() -> str:
    """The accelerator the backend computes on (its kind), or `cpu`."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.devices()[0].device_kind
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "gpu") if gpus else "cpu"


def bench_vocab(sizes, min_seconds):
    rows = []
    for items, cats, label in ((SMALL_ITEMS, SMALL_CATEGORIES, "50k items"),
                               (1_000_000, TAOBAO_CATEGORIES, "1M items"),
                               (TAOBAO_ITEMS, TAOBAO_CATEGORIES, "Taobao 4.07M items")):
        for optimizer in ("adam", "lazy_adam"):
            for size in sizes:
                rate = _step_in_process(REPO, "dare", items, cats, size, optimizer, min_seconds)
                rows.append({"vocabulary": label, "optimizer": optimizer, "batch": size, "train_samples_per_s": rate})
                print(f"  {label} {optimizer} batch={size}: {rate:.0f}/s", flush=True)
    return rows


def bench_end_to_end(work_dir, quick, steps_per_execution=(1,), optimizers=("adam", "lazy_adam")):
    """trainers.train's library call on a generated 1M-row log; samples/s inside the program."""
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.generation.synthetic import SyntheticConfig, write
    from dare_tf.training import TrainConfig, read_history, train

    log = os.path.join(work_dir, "log_1m.csv")
    data_dir = os.path.join(work_dir, "prepared_1m")
    users = 600 if quick else 3000
    if not os.path.exists(os.path.join(data_dir, "spec.json")):
        write(SyntheticConfig(users=users, items=50_000, categories=1_000, min_length=300, max_length=366,
                              length_median=333, length_sigma=0.05, seed=0), log)
        prepare("taobao", log, data_dir)
    spec = DatasetSpec.load(data_dir)
    rows = []
    for optimizer, spe in [(o, s) for o in optimizers for s in steps_per_execution]:
        config = TrainConfig.create(preset="dare", optimizer=optimizer, batch_size=256, eval_batch_size=8192, epochs=2,
                             eval_every=300, verbose=0, model_overrides=dict(embedding_dim=16),
                             steps_per_execution=spe)
        run_dir = os.path.join(work_dir, f"run_{optimizer}_{spe}")
        shutil.rmtree(run_dir, ignore_errors=True)
        start = time.perf_counter()
        results = train(data_dir, run_dir, config)
        wall = time.perf_counter() - start
        history = read_history(os.path.join(run_dir, "seed_0"))
        timing = history[-1]["timing"]
        steps = history[-1]["step"]
        warm = history[1:] or history  # the first evaluation also traces and compiles
        rows.append({
            "optimizer": optimizer, "steps_per_execution": spe, "train_examples": spec.counts["train"],
            "steps": steps,
            "evaluations": len(history), "wall_s": wall,
            "train_samples_per_s": steps * config.schedule.batch_size / timing["train_seconds"],
            "eval_samples_per_s": sum(h["timing"]["val_examples"] for h in history)
            / sum(h["timing"]["val_seconds"] for h in history),
            "eval_samples_per_s_warm": sum(h["timing"]["val_examples"] for h in warm)
            / sum(h["timing"]["val_seconds"] for h in warm),
            "bn_refresh_s_per_eval": sum(h["timing"]["bn_seconds"] for h in history) / len(history),
            "isolated_step_samples_per_s": _step_in_process(REPO, "dare", spec.num_items, spec.num_categories,
                                                            config.schedule.batch_size, optimizer, 3.0, data_dir,
                                                            "mean_samples_per_s"),
            "test_auc": results["test"]["auc"],
        })
        rows[-1]["train/isolated"] = rows[-1]["train_samples_per_s"] / rows[-1]["isolated_step_samples_per_s"]
        print(f"  {rows[-1]}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorflow", "jax"], default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batches", default=None, help="presets, vocabulary: batch sizes (default 256,2048; "
                                                        "--quick: 256)")
    parser.add_argument("--parts", default="presets,vocabulary")
    parser.add_argument("--baseline_ref", default=BASELINE_REF)
    parser.add_argument("--ab_batches", default="256,2048", help="batch sizes of the ab part")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "dare_bench_train"))
    parser.add_argument("--steps_per_execution", default="1", help="end_to_end: comma-separated values to compare")
    parser.add_argument("--optimizers", default="adam,lazy_adam", help="end_to_end: optimizers")
    parser.add_argument("--long_lengths", default="200,1000,10000", help="long: history lengths")
    parser.add_argument("--long_batch", type=int, default=256, help="long: batch size")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    from benchmarks.common import print_table, selected_parts, write_parts

    import keras

    parts = selected_parts(parser, args.parts, ("presets", "vocabulary", "end_to_end", "long", "ab"))
    if keras.backend.backend() != "tensorflow" and parts - {"presets"}:
        parser.error("only --parts=presets runs on JAX (the others use TensorFlow's optimizers or tf.data)")
    min_seconds = 0.5 if args.quick else 2.0
    sizes = [int(b) for b in args.batches.split(",")] if args.batches else [256] if args.quick else [256, 2048]
    print(f"Keras {keras.__version__} on {keras.backend.backend()}, {os.cpu_count()} CPUs")
    payload = {"backend": keras.backend.backend()}
    if "presets" in parts:
        print("presets: samples/s (L=200, K=20, d=16, 50k items; train = Keras train step with Adam)")
        payload["presets"] = bench_presets(sizes, min_seconds)
        print_table(payload["presets"], ["preset", "batch", "train", "predict"])
    if "vocabulary" in parts:
        print("vocabulary: DARE train samples/s by vocabulary and optimizer")
        payload["vocabulary"] = bench_vocab(sizes, min_seconds)
        print_table(payload["vocabulary"], ["vocabulary", "optimizer", "batch", "train_samples_per_s"])
    if "end_to_end" in parts:
        os.makedirs(args.work_dir, exist_ok=True)
        print("end_to_end: the trainer on a generated 1M-row log (DARE, d=16, batch 256, 2 epochs)")
        payload["end_to_end"] = bench_end_to_end(args.work_dir, args.quick,
                                                 [int(v) for v in args.steps_per_execution.split(",")],
                                                 args.optimizers.split(","))
        print_table(payload["end_to_end"], ["optimizer", "steps_per_execution", "train_examples", "steps",
                                            "evaluations", "wall_s",
                                            "train_samples_per_s", "isolated_step_samples_per_s", "train/isolated",
                                            "eval_samples_per_s", "eval_samples_per_s_warm", "bn_refresh_s_per_eval",
                                            "test_auc"])
    if "long" in parts:
        print(f"long: DARE train step with the store pipeline by history length (batch {args.long_batch}, K=20, "
              "50k items, Adam)")
        payload["long"] = bench_long([int(v) for v in args.long_lengths.split(",")], args.long_batch,
                                     min_seconds * 2)
        print_table(payload["long"], ["model", "L", "samples_per_s", "us_per_behaviour", "per_behaviour_vs_L1000",
                                      "peak_rss_mb", "retrieved_only", "error"])
    if "ab" in parts:
        print(f"ab: DARE train step, this checkout vs {args.baseline_ref} (median of 3 alternating rounds)")
        payload["ab"] = bench_ab(args.baseline_ref, args.quick, [int(b) for b in args.ab_batches.split(",")])
        print_table(payload["ab"], ["vocabulary", "optimizer", "batch", "baseline", "now", "now/baseline"])
    write_parts(f"bench_train_{keras.backend.backend()}", payload, sorted(parts), args.json)


if __name__ == "__main__":
    main()
