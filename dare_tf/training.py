"""Training and evaluation on `model.fit`: resumable, multi-seed, optionally distributed.

TensorFlow only (tf.data, tf.distribute, checkpoints). `train(data_dir,
output_dir, TrainConfig(...))` trains one model per seed on a prepared
dataset with `DareModel.fit` and these callbacks:

- `ExactValidation`: every `eval_every` steps (a Keras "epoch" here is
  `eval_every` steps of one continuous input stream) and at the end, refreshes
  BatchNorm's statistics, computes the exact validation metrics (AUC, GAUC,
  category AUC, logloss), keeps the best-on-validation weights, appends the
  metric history, and writes a checkpoint;
- `StopOnNonFiniteLoss`: stops with `NonFiniteLossError` naming the step;
- `StopAtStep`: ends training after `epochs` passes (or `max_steps`);
- Keras's `TensorBoard` and progress bar.

Test metrics of the best weights, overall and by history length, go to
`output_dir/results.json` (mean, std and per-seed values).

Kill-safety: a run directory records its full effective configuration and
the dataset's fingerprint (`run_config.json`); started again with the same
configuration, each seed restores its latest checkpoint, drops history
lines after it and continues the same input stream (fixed per seed and
epoch) from the next batch; finished seeds are reused. Another configuration
is refused with the fields that differ, unless `overwrite=True`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import shutil
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from dare_tf import metrics
from dare_tf._files import atomic_json, describe_entries
from dare_tf.config import ModelConfig, make_config
from dare_tf.data.pipeline import DEFAULT_SHUFFLE_BUFFER, InMemorySplit, make_dataset
from dare_tf.data.spec import HIST_ITEMS, MODEL_INPUTS, TARGET_CATEGORY, USER, DatasetSpec
from dare_tf.models import DareModel
from dare_tf.optimizers import FusedAdam, LazyAdam
from dare_tf.search import search_class

STRATEGIES = ("default", "mirrored", "multi_worker")
OPTIMIZERS = ("adam", "lazy_adam")
RUN_CONFIG = "run_config.json"
BEST_WEIGHTS = "best.weights.h5"
HISTORY = "history.jsonl"
SEED_RESULT = "result.json"
RESULTS = "results.json"
LOCK = ".lock"  # held by the run's writer (run_lock)
METRICS = ("auc", "gauc", "category_auc", "logloss")
# Settings that change what a run prints, not what it computes.
# TrainConfig fields that do not change what a run computes (tested for
# steps_per_execution): a finished run is reused whatever their values.
PRESENTATION_FIELDS = ("verbose", "steps_per_execution")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class RunConfigMismatchError(ValueError):
    """A run directory holds a run with another configuration."""


# Behaviours per evaluation batch at most (B x L): bounds evaluation memory at long L.
EVAL_BEHAVIOURS = 1 << 22


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a training run does.

    Attributes:
        preset: model preset (`dare_tf.PRESETS`).
        model_overrides: `ModelConfig` fields to override (dims, top_k, ...).
        batch_size: global training batch size.
        eval_batch_size: evaluation batch size; at long histories capped at
            `EVAL_BEHAVIOURS // max_len` (at least `batch_size`) so that an
            evaluation batch holds at most ~4M behaviours (8192 at L <= 512).
        learning_rate: Adam learning rate.
        epochs: passes over the training split.
        seeds: one run per seed; results report mean and std.
        eval_every: steps between validation evaluations (and checkpoints).
        optimizer: `adam` (dense, as the reference) or `lazy_adam` (updates
            only the embedding rows in the batch).
        reference_mode: evaluate as the reference code does (BatchNorm with
            per-batch statistics, last partial batch dropped).
        strategy: `default`, `mirrored` (local devices) or `multi_worker`
            (`tf.distribute.MultiWorkerMirroredStrategy` from TF_CONFIG).
        jit_compile: compile everything after the embedding lookups with XLA.
        max_steps: stop each seed after this many steps (None: all epochs).
        shuffle_buffer: examples in the shuffle buffer when the training split
            is streamed (see `in_memory_mb`).
        in_memory_mb: a split whose example columns (of this worker's
            partitions) take at most this many MB (20 bytes per example;
            histories are assembled from the sequence store per batch,
            whatever L) is read into memory once: epochs are then uniform
            permutations cut into static batches. Larger splits stream from
            their TFRecord shards through `shuffle_buffer`. 0 always streams.
        log_every: steps between TensorBoard loss summaries.
        bn_statistics_batches: before each evaluation, BatchNorm's moving
            statistics are set to the average statistics of this many training
            batches under the current weights. The moving average of training
            lags behind weights that move fast: TWIN on the demo log evaluated
            at logloss 2.60 with it, 0.29 after the refresh. 0 turns it off.
            Not used in reference mode (which evaluates with per-batch
            statistics).
        steps_per_execution: at most this many training steps per call of the
            compiled train function (Keras `steps_per_execution`): the trainer
            uses the largest divisor of `eval_every` up to it, so validations
            stay exactly `eval_every` steps apart. Fewer Python round trips per
            step; the same training (tested), but no measurable speed-up on 2
            CPU cores (README, Benchmarks). Callbacks (the non-finite-loss
            check, TensorBoard) see every call's last step. The distributed
            path runs one step per call.
        verbose: 0 silent, 1 Keras progress bar, 2 one line per evaluation.
    """

    preset: str = "dare"
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 2048
    eval_batch_size: int = 8192
    learning_rate: float = 0.01
    epochs: int = 2
    seeds: tuple[int, ...] = (0,)
    eval_every: int = 150
    optimizer: str = "adam"
    reference_mode: bool = False
    strategy: str = "default"
    jit_compile: bool = True
    max_steps: int | None = None
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    in_memory_mb: int = 4096
    log_every: int = 50
    bn_statistics_batches: int = 30
    steps_per_execution: int = 1
    verbose: int = 1

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        checks = [
            (self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {OPTIMIZERS}"),
            (self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}"),
            (self.batch_size >= 1, "batch_size", "must be >= 1"),
            (self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1"),
            (math.isfinite(self.learning_rate) and self.learning_rate > 0, "learning_rate",
             "must be a finite number > 0"),
            (self.epochs >= 1, "epochs", "must be >= 1"),
            (self.eval_every >= 1, "eval_every", "must be >= 1"),
            (self.max_steps is None or self.max_steps >= 1, "max_steps", "must be >= 1"),
            (self.shuffle_buffer >= 1, "shuffle_buffer", "must be >= 1"),
            (self.in_memory_mb >= 0, "in_memory_mb", "must be >= 0"),
            (self.log_every >= 1, "log_every", "must be >= 1"),
            (self.bn_statistics_batches >= 0, "bn_statistics_batches", "must be >= 0"),
            (self.steps_per_execution >= 1, "steps_per_execution", "must be >= 1"),
            (self.verbose in (0, 1, 2), "verbose", "must be 0, 1 or 2"),
            (len(self.seeds) >= 1, "seeds", "needs at least one seed"),
            (len(set(self.seeds)) == len(self.seeds), "seeds", "must not repeat a seed"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: {message}")

    @property
    def execution_steps(self) -> int:
        """Steps per train-function call: the largest divisor of `eval_every` up to `steps_per_execution`."""
        return max(d for d in range(1, min(self.steps_per_execution, self.eval_every) + 1) if self.eval_every % d == 0)


def make_strategy(name: str, cpu_devices: int = 0) -> tf.distribute.Strategy:
    """The distribution strategy; call before any other TensorFlow work.

    `cpu_devices > 1` splits the CPU into that many logical devices (so
    `mirrored` has replicas on a CPU-only machine).
    """
    if cpu_devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy=multi_worker needs the TF_CONFIG environment variable "
                             "(cluster and task); see the README")
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"strategy={name!r}: expected one of {STRATEGIES}")


def _task_id(strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(getattr(resolver, "task_id", 0) or 0)


def _is_chief(strategy) -> bool:
    """The task that writes results: the only one, the `chief`, or worker 0 of a chief-less cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not cluster:
        return True
    if "chief" in cluster:
        return resolver.task_type == "chief"
    return resolver.task_type == "worker" and resolver.task_id == 0


def worker_index(strategy) -> tuple[int, int]:
    """`(this worker's index, number of workers)` of a multi-worker cluster (chief
    first), `(0, 1)` for one process."""
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    tasks = [(kind, i) for kind in ("chief", "worker") for i in range(len(cluster.get(kind, [])))]
    if len(tasks) <= 1:
        return 0, 1
    return tasks.index((resolver.task_type, resolver.task_id)), len(tasks)


def worker_partitions(spec: DatasetSpec, worker: int, workers: int) -> list[int] | None:
    """The partitions (shard indices) worker `worker` of `workers` reads: every
    `workers`-th from its own index; None (all) for one process."""
    if workers == 1:
        return None
    if spec.partitions < workers:
        raise ValueError(f"the dataset has {spec.partitions} partitions but {workers} workers need at least one "
                         "each: prepare it again with --partitions >= the number of workers")
    return list(range(worker, spec.partitions, workers))


def gather_workers(strategy, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each array concatenated over all workers (in worker order), on every worker:
    collective all-gathers of this worker's arrays (padded to the longest)."""
    count = len(next(iter(arrays.values())))
    values = {k: tf.constant(v) for k, v in arrays.items()}

    @tf.function(autograph=False)
    def gather(n, local):
        context = tf.distribute.get_replica_context()
        counts = context.all_gather(tf.reshape(n, [1]), axis=0)
        size = tf.reduce_max(counts)
        padded = {k: tf.pad(v, [[0, size - n]] + [[0, 0]] * (len(v.shape) - 1)) for k, v in local.items()}
        return counts, {k: context.all_gather(v, axis=0) for k, v in padded.items()}

    counts, gathered = strategy.run(gather, args=(tf.constant(count, tf.int64), values))
    counts = strategy.experimental_local_results(counts)[0].numpy()
    size = int(counts.max())
    out = {}
    for k, v in gathered.items():
        v = strategy.experimental_local_results(v)[0].numpy()
        out[k] = np.concatenate([v[i * size: i * size + int(c)] for i, c in enumerate(counts)])
    return out


def make_optimizer(name: str, learning_rate: float):
    """`adam`: Adam (TensorFlow's fused kernel for dense updates); `lazy_adam`: LazyAdam."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r}: expected one of {OPTIMIZERS}")
    return (LazyAdam if name == "lazy_adam" else FusedAdam)(learning_rate=learning_rate)


# -- evaluation -------------------------------------------------------------------

def history_length_buckets(max_len: int) -> list[tuple[str, int, int]]:
    """(name, lowest, highest) history-length buckets: 1-9, 10-49, 50-(L-1), and
    `full` (= L), cut where L is shorter."""
    edges, buckets = [1, 10, 50], []
    for lo, hi in zip(edges, edges[1:] + [max_len]):
        hi = min(hi, max_len) - 1
        if lo <= hi:
            buckets.append((f"{lo}-{hi}", lo, hi))
    return buckets + [("full", max_len, max_len)]


def metrics_by_history_length(outputs: dict[str, np.ndarray], max_len: int) -> dict[str, dict]:
    """Metrics and example count per history-length bucket (empty buckets left out)."""
    out = {}
    lengths = outputs["history_length"]
    for name, lo, hi in [("0", 0, 0)] + history_length_buckets(max_len):
        sel = (lengths >= lo) & (lengths <= hi)
        if sel.any():
            out[name] = dict(count=int(sel.sum()), **metrics.evaluate(
                outputs["labels"][sel], outputs["probabilities"][sel], outputs["users"][sel],
                outputs["categories"][sel]))
    return out


def _compiled(model: DareModel, what: str, training: bool = False):
    """The model's graph function for `predict` (probabilities of a feature dict) or
    `features` (the inputs of its BatchNorm layers), traced once per model."""
    cache = model.__dict__.setdefault("_dare_training_functions", {})
    if (what, training) not in cache:
        if what == "predict":
            fn = lambda x: model.forward({k: x[k] for k in MODEL_INPUTS}, training=training)["probability"]  # noqa: E731
        else:
            norms = model.batch_norm_layers()
            fn = lambda x: {k: tf.cast(v, tf.float32)  # noqa: E731
                            for k, v in model.forward(x, training=False).items() if k in norms}
        cache[(what, training)] = tf.function(fn, autograph=False, reduce_retracing=True)
    return cache[(what, training)]


def predict_split(model: DareModel, data_dir: str, split: str, batch_size: int, spec: DatasetSpec,
                  drop_remainder: bool = False, training: bool = False, partitions=None) -> dict[str, np.ndarray]:
    """Predictions over a whole split (or its `partitions`): `labels`,
    `probabilities`, `users`, `categories` and `history_length` arrays, in the
    split's file order."""
    ds = make_dataset(data_dir, split, batch_size, shuffle=False, drop_remainder=drop_remainder,
                      deterministic=True, spec=spec, max_len=model.model_config.max_len, partitions=partitions)
    return predict_batches(model, ds, training, f"{data_dir}: the {split} split")


def predict_batches(model: DareModel, batches, training: bool = False,
                    what: str = "the data") -> dict[str, np.ndarray]:
    """`predict_split`'s arrays over `(features, label)` batches."""
    predict = _compiled(model, "predict", training)
    parts: dict[str, list] = {k: [] for k in ("labels", "probabilities", "users", "categories",
                                                "history_length")}
    for x, y in batches:
        parts["probabilities"].append(predict(x).numpy())
        parts["labels"].append(y.numpy())
        parts["users"].append(x[USER].numpy())
        parts["categories"].append(x[TARGET_CATEGORY].numpy())
        parts["history_length"].append((x[HIST_ITEMS].numpy() > 0).sum(axis=1))
    if not parts["labels"]:
        raise ValueError(f"{what} has no complete batch")
    return {k: np.concatenate(v) for k, v in parts.items()}


def evaluate_outputs(outputs: dict[str, np.ndarray]) -> dict[str, float]:
    return metrics.evaluate(outputs["labels"], outputs["probabilities"], outputs["users"],
                            outputs["categories"])


def refresh_batch_norm_statistics(model: DareModel, batches, combine=None) -> None:
    """Sets each BatchNorm layer's moving mean and variance to the average of the
    per-batch statistics of its input over `batches` (feature dicts) under the
    current weights ("precise BatchNorm"); no weight changes. `combine`
    (`gather_workers`) averages over the batches of every worker."""
    norms = model.batch_norm_layers()
    features = _compiled(model, "features")
    sums: dict[str, list] = {}
    count = 0
    for x in batches:
        for name, value in features({k: x[k] for k in MODEL_INPUTS}).items():
            mean, variance = tf.nn.moments(value, axes=[0])
            total = sums.setdefault(name, [0.0, 0.0])
            total[0] += mean.numpy()
            total[1] += variance.numpy()
        count += 1
    if combine is not None:
        stacked = combine({"count": np.array([count], np.float64),
                           **{f"{n}/{i}": np.asarray(v[i], np.float64)[None] for n, v in sums.items() for i in (0, 1)}})
        count = stacked["count"].sum()
        sums = {n: [stacked[f"{n}/0"].sum(0), stacked[f"{n}/1"].sum(0)] for n in sums}
    for name, (mean, variance) in sums.items():
        norms[name].moving_mean.assign(mean / count)
        norms[name].moving_variance.assign(variance / count)


# -- callbacks ----------------------------------------------------------------------

class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises `NonFiniteLossError` naming the step when the training loss becomes NaN or infinite."""

    def __init__(self, describe: Callable[[int], str]):
        super().__init__()
        self.describe = describe

    def on_train_batch_end(self, batch, logs=None):
        loss = float((logs or {}).get("loss", 0.0))
        if not math.isfinite(loss):
            step = int(self.model.optimizer.iterations.numpy())
            raise NonFiniteLossError(f"training loss became {loss} at step {step} ({self.describe(step)}); "
                                     "lower --learning_rate or check the data")


class StopAtStep(keras.callbacks.Callback):
    """Ends `fit` after the optimizer's step `total_steps` (mid-epoch if need be)."""

    def __init__(self, steps_per_epoch: int, total_steps: int):
        super().__init__()
        self.steps_per_epoch, self.total_steps, self.first = steps_per_epoch, total_steps, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.first = epoch * self.steps_per_epoch

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: the epoch's last step done (several with steps_per_execution). Counted
        # here: reading the optimizer's counter would wait for the step to finish.
        if self.first + batch + 1 >= self.total_steps:
            self.model.stop_training = True


class ExactValidation(keras.callbacks.Callback):
    """At the end of each Keras epoch (`eval_every` steps): BatchNorm refresh,
    exact validation metrics, best weights, history line, checkpoint; the
    metrics go into the epoch's logs as `val_*` (TensorBoard, progress bar)."""

    def __init__(self, run: "_SeedRun"):
        super().__init__()
        self.run = run
        self.fit_started = time.perf_counter()
        self.evaluating = 0.0

    def on_train_begin(self, logs=None):
        self.fit_started, self.evaluating = time.perf_counter(), 0.0

    def on_epoch_end(self, epoch, logs=None):
        run = self.run
        step = int(self.model.optimizer.iterations.numpy())
        started = time.perf_counter()
        run.refresh_batch_norm_statistics()
        refreshed = time.perf_counter()
        outputs = run.predict("val")
        val = evaluate_outputs(outputs)
        predicted = time.perf_counter()
        timing = {"train_seconds": started - self.fit_started - self.evaluating,
                  "bn_seconds": refreshed - started, "val_seconds": predicted - refreshed,
                  "val_examples": int(len(outputs["labels"]))}
        improved = val["auc"] > float(run.best_auc)
        if improved:
            run.best_auc.assign(val["auc"])
            run.best_step.assign(step)
            tmp = os.path.join(run.work_dir, f"best.tmp-{os.getpid()}.weights.h5")
            self.model.save_weights(tmp)
            os.replace(tmp, os.path.join(run.work_dir, BEST_WEIGHTS))
        if logs is not None:
            logs.update({f"val_{k}": v for k, v in val.items()})
        # History first, then the checkpoint: a kill between the two re-runs
        # these steps, and resuming drops history lines past the checkpoint.
        run.append_history({"step": step, "epoch": step // run.steps_per_epoch,
                            "train_loss": float((logs or {}).get("loss", float("nan"))), "val": val,
                            "best": improved, "seconds": time.perf_counter() - run.started, "timing": timing})
        run.manager.save(checkpoint_number=step)
        run.report(step, val, improved)
        self.evaluating += time.perf_counter() - started


# -- one seed -------------------------------------------------------------------------

class _SeedRun:
    """One seed: its model, optimizer, checkpoint, input stream and history."""

    def __init__(self, data_dir: str, run_dir: str, config: TrainConfig, seed: int, spec: DatasetSpec,
                 strategy, chief: bool, model_config, report: Callable[[str], None],
                 memory: dict[str, InMemorySplit] | None = None):
        self.data_dir, self.run_dir, self.config, self.seed = data_dir, run_dir, config, seed
        self.memory = memory or {}
        self.spec, self.strategy, self.chief, self.model_config = spec, strategy, chief, model_config
        self._print = report
        os.makedirs(run_dir, exist_ok=True)
        self.distributed = strategy.num_replicas_in_sync > 1 or config.strategy != "default"
        if self.distributed and config.batch_size % strategy.num_replicas_in_sync:
            raise ValueError(f"batch_size={config.batch_size} must be divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas")
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            # Row-wise updates need sparse table gradients; dense Adam updates every row
            # anyway and is faster with the lookups inside the compiled forward pass.
            self.model = DareModel(model_config, seed=seed, name=config.preset,
                                   jit_compile_dense=config.jit_compile,
                                   sparse_embedding_gradients=config.optimizer == "lazy_adam")
            self.model.build()
            self.model.compile(optimizer=make_optimizer(config.optimizer, config.learning_rate),
                               metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000)],
                               steps_per_execution=config.execution_steps)
            self.model.optimizer.build(self.model.trainable_variables)
        self.best_auc = tf.Variable(-1.0, dtype=tf.float64, trainable=False, name="best_val_auc")
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer,
                                              best_auc=self.best_auc, best_step=self.best_step)
        # Non-chief workers save too (checkpointing is collective), into their own scratch
        # directory, where they also keep their copy of the best weights.
        self.work_dir = run_dir if chief else os.path.join(run_dir, f".worker-{_task_id(strategy)}")
        os.makedirs(self.work_dir, exist_ok=True)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(self.work_dir, "checkpoints"), max_to_keep=2)
        # Each worker reads its own partitions (users) of every split: per-worker input and
        # store memory ~1/W. Every worker runs the same steps per epoch: the fewest full
        # local batches any worker's partitions hold (the rest of a larger partition set is
        # left out of that epoch, a different rest each epoch as the order is reshuffled).
        self.worker, self.workers = worker_index(strategy)
        self.partitions = worker_partitions(spec, self.worker, self.workers)
        self.local_batch = config.batch_size // self.workers
        if self.workers > 1:
            if config.batch_size % self.workers:
                raise ValueError(f"batch_size={config.batch_size} must be divisible by the {self.workers} workers")
            counts = [sum(spec.records(n) for n in spec.shard_files("train", worker_partitions(spec, w, self.workers)))
                      for w in range(self.workers)]
            self.steps_per_epoch = min(counts) // self.local_batch
            self.total_steps = self.steps_per_epoch * config.epochs
        else:
            count, batch = spec.counts["train"], config.batch_size
            # In memory, the epochs' permutations run back to back, cut into full batches
            # (static shapes: LazyAdam's step ran 2x faster with them); streamed, every
            # epoch ends with its partial batch, dropped when distributed.
            self.steps_per_epoch = (count // batch if self.distributed or "train" in self.memory
                                    else math.ceil(count / batch))
            self.total_steps = (config.epochs * count // batch if "train" in self.memory
                                else self.steps_per_epoch * config.epochs)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{data_dir}: the train split has fewer examples ({spec.counts['train']}"
                             f"{'' if self.workers == 1 else ' over all workers; the fewest on one worker'}) "
                             f"than one batch ({self.local_batch} per {'worker' if self.workers > 1 else 'step'})")
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.started = time.perf_counter()

    # -- data ---------------------------------------------------------------------------
    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.memory["train"]))

    def _epoch_batches(self, epoch: int, shuffle_buffer: int | None = None):
        """Training batches of one pass over this worker's partitions, in an order
        fixed by seed and epoch (`steps_per_epoch` local batches)."""
        if "train" in self.memory:
            order = self._permutation(epoch)[: self.steps_per_epoch * self.local_batch if self.workers > 1 else None]
            return self.memory["train"].batches(order, self.local_batch)
        return make_dataset(self.data_dir, "train", self.local_batch, shuffle=True,
                            shuffle_buffer=shuffle_buffer or self.config.shuffle_buffer, deterministic=True,
                            seed=self.seed * 1000 + epoch, spec=self.spec, partitions=self.partitions,
                            drop_remainder=self.distributed,
                            max_len=self.model_config.max_len).take(self.steps_per_epoch)

    def train_stream(self, skip: int):
        """All training batches from step `skip` on, features and label; distributed,
        each input pipeline (worker) reads its own partitions."""
        batch = self.local_batch
        if "train" in self.memory:
            # Examples per epoch: the whole split, or a worker's equal share.
            per_epoch = self.steps_per_epoch * batch if self.workers > 1 else len(self.memory["train"])
            first = skip * batch // per_epoch
            order = np.concatenate([self._permutation(e)[:per_epoch] for e in range(first, self.config.epochs)])
            start = skip * batch - first * per_epoch
            ds = self.memory["train"].batches(order[start: start + (self.total_steps - skip) * batch], batch)
        else:
            first = skip // self.steps_per_epoch
            ds = self._epoch_batches(first).skip(skip - first * self.steps_per_epoch)
            for epoch in range(first + 1, self.config.epochs):
                ds = ds.concatenate(self._epoch_batches(epoch))
            ds = ds.take(self.total_steps - skip)
        ds = ds.map(lambda x, y: ({k: x[k] for k in MODEL_INPUTS}, y))
        if not self.distributed:
            return ds.prefetch(tf.data.AUTOTUNE)
        per_replica = self.config.batch_size // self.strategy.num_replicas_in_sync

        def dataset_fn(context):
            if context.num_input_pipelines != self.workers:
                raise ValueError(f"{context.num_input_pipelines} input pipelines for {self.workers} workers")
            return ds.rebatch(per_replica)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    @property
    def eval_batch_size(self) -> int:
        cap = max(self.config.batch_size, EVAL_BEHAVIOURS // self.model_config.max_len)
        return min(self.config.eval_batch_size, cap)

    def predict(self, split: str) -> dict[str, np.ndarray]:
        """Predictions over the whole split: this worker's partitions, gathered
        from every worker (in worker order) when there are several."""
        if split in self.memory:
            # Every batch full-sized (the last one padded with example 0, its outputs
            # dropped): one compiled shape for all evaluations.
            size, count = self.eval_batch_size, len(self.memory[split])
            count = count // size * size if self.config.reference_mode else count
            order = np.zeros(-(-count // size) * size, np.int64)
            order[:count] = np.arange(count)
            outputs = predict_batches(self.model, self.memory[split].batches(order, size),
                                      self.config.reference_mode, f"{self.data_dir}: the {split} split")
            outputs = {k: v[:count] for k, v in outputs.items()}
        else:
            outputs = predict_split(self.model, self.data_dir, split, self.eval_batch_size, self.spec,
                                    drop_remainder=self.config.reference_mode, training=self.config.reference_mode,
                                    partitions=self.partitions)
        return gather_workers(self.strategy, outputs) if self.workers > 1 else outputs

    def refresh_batch_norm_statistics(self) -> None:
        cfg = self.config
        if cfg.reference_mode or not cfg.bn_statistics_batches:
            return
        # A small shuffle buffer: a mixed sample of the training split, cheap to fill.
        batches = self._epoch_batches(999, min(cfg.shuffle_buffer, 8 * cfg.batch_size))
        combine = (lambda stats: gather_workers(self.strategy, stats)) if self.workers > 1 else None
        refresh_batch_norm_statistics(self.model, (x for x, _ in batches.take(cfg.bn_statistics_batches)), combine)

    # -- history and reporting ---------------------------------------------------------
    def _history_path(self) -> str:
        return os.path.join(self.run_dir, HISTORY)

    def _truncate_history(self, step: int) -> None:
        kept = [h for h in read_history(self.run_dir) if h["step"] <= step]
        if self.chief:
            tmp = self._history_path() + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(h) + "\n" for h in kept)
            os.replace(tmp, self._history_path())

    def append_history(self, entry: dict) -> None:
        if self.chief:
            with open(self._history_path(), "a") as f:
                f.write(json.dumps(entry, default=float) + "\n")

    def report(self, step: int, val: dict, improved: bool) -> None:
        if self.chief and self.config.verbose == 2:
            self._print(f"{self.config.preset} on {self.spec.dataset} {os.path.basename(self.data_dir)} seed "
                        f"{self.seed}, step {step}/{self.total_steps}: validation "
                        + " ".join(f"{k} {v:.4f}" for k, v in val.items()) + (" (best)" if improved else ""))

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.config
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
            logging.info("seed %d: resumed from %s at step %d", self.seed, self.manager.latest_checkpoint,
                         int(self.model.optimizer.iterations.numpy()))
        step = int(self.model.optimizer.iterations.numpy())
        self._truncate_history(step)
        if step < self.total_steps:
            callbacks = [
                StopOnNonFiniteLoss(lambda s: f"epoch {(s - 1) // self.steps_per_epoch}, seed {self.seed} "
                                              f"of {cfg.preset}"),
                StopAtStep(cfg.eval_every, self.total_steps),
                ExactValidation(self),
            ]
            if self.chief:
                callbacks.append(keras.callbacks.TensorBoard(os.path.join(self.run_dir, "tensorboard"),
                                                             update_freq=cfg.log_every))
            fit = _fit_distributed if self.distributed else keras.Model.fit
            fit(self.model, self.train_stream(step), steps_per_epoch=cfg.eval_every,
                epochs=math.ceil(self.total_steps / cfg.eval_every), initial_epoch=step // cfg.eval_every,
                callbacks=callbacks, shuffle=False, verbose=1 if cfg.verbose == 1 and self.chief else 0)
        return self._finish()

    def _finish(self) -> dict:
        steps = int(self.model.optimizer.iterations.numpy())
        best = os.path.join(self.work_dir, BEST_WEIGHTS)
        if os.path.exists(best):
            self.model.load_weights(best)  # (the optimizer's state of that step too)
        history = read_history(self.run_dir)
        best_entry = next((h for h in history if h["step"] == int(self.best_step)), None)
        test = self.predict("test")
        result = {
            "seed": self.seed,
            "steps": steps,
            "best_step": int(self.best_step),
            "val": best_entry["val"] if best_entry else evaluate_outputs(self.predict("val")),
            "test": evaluate_outputs(test),
            "test_by_history_length": metrics_by_history_length(test, self.model_config.max_len),
            "model_config": self.model_config.to_dict(),
        }
        if self.chief:
            self.model.save(os.path.join(self.run_dir, "model.keras"))
            atomic_json(os.path.join(self.run_dir, SEED_RESULT), result)
        return result


def _fit_distributed(model, dataset, steps_per_epoch, epochs, initial_epoch, callbacks, verbose, shuffle):
    """`model.fit` for a dataset that a distribution strategy already distributed
    (each input pipeline keeps its slice of every global batch, so N replicas
    train on exactly the batches one process would).

    Measured with Keras 3.15.1 on TF 2.21: `fit` cannot take a distributed
    dataset (it tries to convert its per-replica values to tensors); under
    `MultiWorkerMirroredStrategy` Keras's own train function fails when it
    reduces the scalar logs ("Invalid reduction dimension 0 for input with 0
    dimensions"); under `MirroredStrategy` over 2 logical CPUs, `fit` with a
    plain dataset ran, but its weights after 2 steps differed from one
    process's by up to 0.04 (this loop: < 2e-3, the float-order noise of the
    all-reduce). This loop runs the model's own `train_step` (the one `fit`
    runs, with the same `compute_loss`) in `strategy.run`, reduces its logs
    over replicas, and drives the same callbacks.
    """
    del shuffle
    strategy = model.distribute_strategy
    callbacks = keras.callbacks.CallbackList(callbacks, model=model, add_progbar=bool(verbose),
                                             verbose=verbose, epochs=epochs, steps=steps_per_epoch)

    @tf.function(autograph=False)
    def train_function(iterator):
        logs = strategy.run(model.train_step, args=(next(iterator),))
        return {k: strategy.reduce("MEAN", v, axis=None) for k, v in logs.items()}

    iterator = iter(dataset)
    model.stop_training = False
    callbacks.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        logs = {}
        for batch in range(steps_per_epoch):
            callbacks.on_train_batch_begin(batch)
            try:
                logs = train_function(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                model.stop_training = True
                break
            logs = {k: float(v) for k, v in logs.items()}  # (train_step returns the metrics' results)
            callbacks.on_train_batch_end(batch, logs)
            if model.stop_training:
                break
        callbacks.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    callbacks.on_train_end()


def read_history(run_dir: str) -> list[dict]:
    """The evaluation history of one seed's run directory (one dict per evaluation)."""
    path = os.path.join(run_dir, HISTORY)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# -- the run directory ---------------------------------------------------------------

def run_identity(config: TrainConfig, model_config, spec: DatasetSpec) -> dict:
    """What defines a run's results: the training and model configurations and the dataset."""
    train = {k: v for k, v in dataclasses.asdict(config).items() if k not in PRESENTATION_FIELDS}
    train["seeds"] = list(train["seeds"])
    return {"train_config": train, "model_config": model_config.to_dict(),
            "dataset": {"name": spec.dataset, "fingerprint": spec.fingerprint()}}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _own_entries(output_dir: str) -> list[str]:
    """The entries of a run directory that `train` (and its programs) wrote."""
    own = re.compile(r"seed_\d+|results\.json|run_config\.json|flags\.txt|curves\.png")
    return sorted(e for e in os.listdir(output_dir) if own.fullmatch(e)) if os.path.isdir(output_dir) else []


class RunLockedError(OSError):
    """Another process is training into the same run directory."""


@contextlib.contextmanager
def run_lock(output_dir: str):
    """Holds `output_dir/.lock` exclusively (`flock`) while the block runs, with
    the holder's pid in it; raises `RunLockedError` naming that pid when another
    process holds it. The kernel releases the lock of a process that dies, so a
    killed trainer's lock is taken over by the next run."""
    os.makedirs(output_dir, exist_ok=True)
    fd = os.open(os.path.join(output_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunLockedError(f"{output_dir} is in use by another trainer (pid {holder}); wait for it to finish "
                             "or choose another --output_dir") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_run_dir(output_dir: str, identity: dict, overwrite: bool = False) -> None:
    """Refuses (`RunConfigMismatchError`) to continue a run directory that holds a
    run of another configuration or dataset, naming the fields that differ;
    `overwrite=True` removes that run's files (only those) instead."""
    path = os.path.join(output_dir, RUN_CONFIG)
    if os.path.exists(path):
        with open(path) as f:
            recorded = json.load(f)
        old, new = _flatten(recorded), _flatten(json.loads(json.dumps(identity)))
        # A model field added after the run was recorded, at its default value, is the
        # architecture the run had (new fields default to the earlier behaviour).
        defaults = {f"model_config.{f.name}": f.default for f in dataclasses.fields(ModelConfig)}
        # Presentation fields do not define a run (runs recorded before a field became one
        # still list it).
        presentation = {f"train_config.{f}" for f in PRESENTATION_FIELDS}
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in presentation
                        and not (k not in old and k in defaults and new.get(k) == defaults[k]))
        if not differ:
            return
        detail = "; ".join(f"{k}: {old.get(k)!r} in the run, {new.get(k)!r} now" for k in differ[:8])
        more = f" (and {len(differ) - 8} more)" if len(differ) > 8 else ""
        problem = f"{output_dir} holds a run with another configuration: {detail}{more}"
    elif _own_entries(output_dir):
        problem = (f"{output_dir} holds a run without {RUN_CONFIG} (written by an older version): "
                   f"{describe_entries(output_dir)}; its configuration cannot be checked")
    else:
        return
    if not overwrite:
        raise RunConfigMismatchError(f"{problem}. Use another output directory, or --overwrite to "
                                     "discard that run")
    for entry in _own_entries(output_dir):
        target = os.path.join(output_dir, entry)
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    logging.warning("%s: discarded the previous run (--overwrite)", output_dir)


def summarize(per_seed: list[dict]) -> dict:
    out = {}
    for split in ("val", "test"):
        values = {m: np.array([r[split][m] for r in per_seed], float) for m in METRICS}
        out[split] = {m: float(v.mean()) for m, v in values.items()}
        out[f"{split}_std"] = {m: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for m, v in values.items()}
    buckets = {}
    for r in per_seed:
        for name, entry in r.get("test_by_history_length", {}).items():
            buckets.setdefault(name, []).append(entry)
    out["test_by_history_length"] = {
        name: {"count": entries[0]["count"], **{m: float(np.mean([e[m] for e in entries])) for m in METRICS}}
        for name, entries in buckets.items()}
    return out


def format_results(results: dict) -> str:
    """The test metrics overall and by history length, as a Markdown table."""
    rows = [("all", {"count": None, **results["test"]})]
    rows += list(results.get("test_by_history_length", {}).items())
    lines = ["| history length | examples | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 2) + "|"]
    for name, entry in rows:
        count = "" if entry["count"] is None else f"{entry['count']:,}"
        lines.append(f"| {name} | {count} | " + " | ".join(f"{entry[m]:.4f}" for m in METRICS) + " |")
    return "\n".join(lines)


def effective_model_config(config: TrainConfig, spec: DatasetSpec, strategy):
    """The `ModelConfig` a run trains: the preset, the overrides, and what the
    dataset (vocabularies, L) and the strategy (synchronised BatchNorm) imply."""
    distributed = strategy.num_replicas_in_sync > 1 or config.strategy != "default"
    overrides = dict(config.model_overrides)
    if config.reference_mode:
        overrides.setdefault("initializer", "reference")
    overrides.setdefault("max_len", spec.max_len)
    if "num_positions" not in overrides:  # position ids run up to L
        default = make_config(config.preset, spec.num_items, spec.num_categories).num_positions
        overrides["num_positions"] = max(default, overrides["max_len"] + 1)
    if distributed:
        overrides["synchronized_batch_norm"] = True
    model_config = make_config(config.preset, spec.num_items, spec.num_categories, **overrides)
    if search_class(model_config.search).keeps_top_k and model_config.top_k > model_config.max_len:
        raise ValueError(f"top_k={model_config.top_k} is larger than the history length "
                         f"max_len={model_config.max_len} of the dataset")
    return model_config


def train(data_dir: str, output_dir: str, config: TrainConfig,
          strategy: tf.distribute.Strategy | None = None, overwrite: bool = False,
          report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """Trains every seed of `config` (resuming or reusing finished ones) and
    writes `output_dir/results.json`; returns its content.

    `report` receives one line per validation (with `verbose=2`);
    `flags_text`, the program's effective flags, is written to
    `output_dir/flags.txt` (a flagfile that reproduces the run).
    """
    spec = DatasetSpec.load(data_dir)
    strategy = strategy or make_strategy(config.strategy)
    chief = _is_chief(strategy)
    # One writer per run directory: the chief holds its lock for the whole run; the
    # configuration check and the first write happen under it.
    with run_lock(output_dir) if chief else contextlib.nullcontext():
        return _train(data_dir, output_dir, config, spec, strategy, chief, overwrite, report, flags_text)


def _train(data_dir, output_dir, config, spec, strategy, chief, overwrite, report, flags_text) -> dict:
    model_config = effective_model_config(config, spec, strategy)
    identity = run_identity(config, model_config, spec)
    if chief:
        check_run_dir(output_dir, identity, overwrite)
        os.makedirs(output_dir, exist_ok=True)
        atomic_json(os.path.join(output_dir, RUN_CONFIG), identity)
        if flags_text is not None:
            with open(os.path.join(output_dir, "flags.txt"), "w") as f:
                f.write(flags_text)
    memory = None
    per_seed = []
    for seed in config.seeds:
        run_dir = os.path.join(output_dir, f"seed_{seed}")
        done = os.path.join(run_dir, SEED_RESULT)
        if os.path.exists(done):
            with open(done) as f:
                per_seed.append(json.load(f))
            logging.info("seed %d: already finished, reusing %s", seed, done)
            continue
        if memory is None:  # loaded once, for the first seed that trains: this worker's partitions
            partitions = worker_partitions(spec, *worker_index(strategy))
            memory = {split: InMemorySplit.load(data_dir, split, spec, model_config.max_len, partitions)
                      for split in ("train", "val")
                      if InMemorySplit.estimated_bytes(spec, split, partitions) <= config.in_memory_mb * 2**20}
        per_seed.append(_SeedRun(data_dir, run_dir, config, seed, spec, strategy, chief, model_config,
                                 report, memory).run())
    results = {
        "data_dir": os.path.abspath(data_dir),
        "dataset": spec.dataset,
        "config": identity["train_config"],
        "seeds": list(config.seeds),
        **summarize(per_seed),
        "per_seed": per_seed,
    }
    if chief:
        atomic_json(os.path.join(output_dir, RESULTS), results)
        write_curves(output_dir, config)
    return results


def write_curves(output_dir: str, config: TrainConfig) -> str:
    """`output_dir/curves.png`: training loss and validation metrics against steps, per seed."""
    from dare_tf.analysis.figures import training_curves

    histories = {f"seed {s}": read_history(os.path.join(output_dir, f"seed_{s}")) for s in config.seeds}
    return training_curves({k: v for k, v in histories.items() if v}, os.path.join(output_dir, "curves.png"),
                           f"{config.preset}: {os.path.basename(os.path.normpath(output_dir))}")
