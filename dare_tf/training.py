"""Training and evaluation: resumable, multi-seed, optionally distributed.

`train(data_dir, output_dir, TrainConfig(...))` trains one model per seed on a
prepared dataset, evaluates validation metrics every `eval_every` steps,
keeps the best-on-validation weights, reports test metrics of those, and
writes `output_dir/results.json` (mean, std and per-seed values).

Kill-safety: each seed's run directory holds a checkpoint (model, optimizer,
step, best score) written at every evaluation and epoch end, and the metric
history as JSON lines. Started again with the same arguments, a run restores
the latest checkpoint, drops history lines after it, rebuilds that epoch's
input order (deterministic per seed and epoch) and skips the batches
already trained on; finished seeds are not trained again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from tqdm import tqdm

from dare_tf import metrics
from dare_tf.config import make_config
from dare_tf.input_pipeline import make_dataset
from dare_tf.models import INPUT_KEYS, DareModel
from dare_tf.optimizers import FusedAdam, LazyAdam
from dare_tf.spec import DatasetSpec

STRATEGIES = ("default", "mirrored", "multi_worker")
OPTIMIZERS = ("adam", "lazy_adam")
BEST_WEIGHTS = "best.weights.h5"
HISTORY = "history.jsonl"
SEED_RESULT = "result.json"
RESULTS = "results.json"
METRICS = ("auc", "gauc", "category_auc", "logloss")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a training run does.

    Attributes:
        preset: model preset (`dare_tf.PRESETS`).
        model_overrides: `ModelConfig` fields to override (dims, top_k, ...).
        batch_size: global training batch size.
        eval_batch_size: evaluation batch size.
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
        jit_compile: compile the forward and backward pass with XLA.
        max_steps: stop each seed after this many steps (None: all epochs).
        shuffle_buffer: examples in the shuffle buffer.
        log_every: steps between loss summaries.
        bn_statistics_batches: before each evaluation, BatchNorm's moving
            statistics are set to the average statistics of this many training
            batches under the current weights. The moving average of training
            lags behind weights that move fast: TWIN on the demo log evaluated
            at logloss 2.60 with it, 0.29 after the refresh. 0 turns it off.
            Not used in reference mode (which evaluates with per-batch
            statistics).
    """

    preset: str = "dare"
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 2048
    eval_batch_size: int = 2048
    learning_rate: float = 0.01
    epochs: int = 2
    seeds: tuple[int, ...] = (0,)
    eval_every: int = 150
    optimizer: str = "adam"
    reference_mode: bool = False
    strategy: str = "default"
    jit_compile: bool = True
    max_steps: int | None = None
    shuffle_buffer: int = 100_000
    log_every: int = 50
    bn_statistics_batches: int = 30

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(self.seeds))
        checks = [
            (self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {OPTIMIZERS}"),
            (self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}"),
            (self.batch_size >= 1, "batch_size", "must be >= 1"),
            (self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1"),
            (self.epochs >= 1, "epochs", "must be >= 1"),
            (self.eval_every >= 1, "eval_every", "must be >= 1"),
            (self.bn_statistics_batches >= 0, "bn_statistics_batches", "must be >= 0"),
            (len(self.seeds) >= 1, "seeds", "needs at least one seed"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: {message}")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


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
            raise ValueError("--strategy=multi_worker needs the TF_CONFIG environment variable "
                             "(cluster and task); see the README")
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"unknown strategy {name!r}; expected one of {STRATEGIES}")


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


def _atomic_json(path: str, payload) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True, default=float)
    os.replace(tmp, path)


def make_optimizer(name: str, learning_rate: float):
    """`adam`: Adam (TensorFlow's fused kernel for dense updates); `lazy_adam`: LazyAdam."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")
    return (LazyAdam if name == "lazy_adam" else FusedAdam)(learning_rate=learning_rate)


def make_train_step(model: DareModel, optimizer, strategy=None, jit_compile: bool = True):
    """`step(x, y) -> mean loss`: forward, backward and optimizer update.

    - Dense Adam with XLA: forward, backward and the densification of the
      embedding gradients are compiled (XLA's scatter is ~10x faster than
      TensorFlow's here); the update runs TensorFlow's fused Adam kernel
      (XLA's elementwise Adam costs several times more on CPU).
    - LazyAdam: the embedding rows are read row by row outside XLA (see
      `gather_rows`), so the tables' gradients stay sparse `IndexedSlices`;
      the rest of the forward and backward pass is compiled; only the
      batch's rows are updated.
    - Under a distribution strategy (jit_compile off): one graph per replica
      (synchronised BatchNorm cannot sit in a nested compiled function).
    """
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    variables = model.trainable_variables
    sparse = getattr(optimizer, "sparse_updates", False)

    def loss_of(x, y, gathered=None):
        return model.loss_terms(y, model.forward(x, training=True, gathered=gathered))["total"]

    # No data-dependent Python control flow here: AutoGraph is not needed.
    if jit_compile and not sparse:
        @tf.function(jit_compile=True, autograph=False)
        def dense_gradients(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

        @tf.function(autograph=False)
        def dense_step(x, y):
            loss, grads = dense_gradients(x, y)
            optimizer.apply(grads, variables)
            return loss

        return dense_step

    compiled_loss = tf.function(loss_of, jit_compile=True, autograph=False) if jit_compile else loss_of

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            gathered = model.lookup_embeddings(x, sparse_reads=sparse) if jit_compile or sparse else None
            loss = compiled_loss(x, y, gathered)
            scaled = loss / replicas
        optimizer.apply(tape.gradient(scaled, variables), variables)
        return loss

    @tf.function(autograph=False)
    def step(x, y):
        loss = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)

    return step


def make_statistics_step(model: DareModel, strategy=None, jit_compile: bool = True,
                         sparse_reads: bool = False):
    """`step(x, weight)`: a forward pass in training mode and no weight update.

    Each BatchNorm layer's moving statistics become `(1 - weight) * moving +
    weight * (the batch's statistics)`. With `weight = 1 / i` for the i-th of
    n batches they end as the plain average over those n batches under the
    current weights, whatever they held before ("precise BatchNorm").
    Synchronised across replicas under a strategy. `sparse_reads`: read the
    embedding rows row by row (tables that LazyAdam updates; see `gather_rows`).
    """
    strategy = strategy or tf.distribute.get_strategy()
    norms = model.batch_norm_layers()

    def forward(x, weight, gathered):
        # Keras's BatchNormalization reads `self.momentum` when it is traced: for this
        # function only, that is `1 - weight`, a tensor.
        momenta = [bn.momentum for bn in norms]
        for bn in norms:
            bn.momentum = 1.0 - weight
        try:
            return model.forward(x, training=True, gathered=gathered)["probability"]
        finally:
            for bn, momentum in zip(norms, momenta):
                bn.momentum = momentum

    # As in `make_train_step`: synchronised BatchNorm cannot sit in a nested tf.function.
    compiled = tf.function(forward, jit_compile=True, autograph=False) if jit_compile else forward

    def replica_step(x, weight):
        gathered = model.lookup_embeddings(x, sparse_reads=True) if sparse_reads else None
        return compiled(x, weight, gathered)

    @tf.function(autograph=False)
    def step(x, weight):
        strategy.run(replica_step, args=(x, weight))

    return step


class _SeedRun:
    """One seed: model, optimizer, checkpoint, the compiled steps."""

    def __init__(self, data_dir: str, run_dir: str, config: TrainConfig, seed: int,
                 spec: DatasetSpec, strategy, chief: bool):
        self.data_dir, self.run_dir, self.config, self.seed = data_dir, run_dir, config, seed
        self.spec, self.strategy, self.chief = spec, strategy, chief
        os.makedirs(run_dir, exist_ok=True)
        distributed = strategy.num_replicas_in_sync > 1 or config.strategy != "default"
        self.distributed = distributed
        if distributed and config.batch_size % strategy.num_replicas_in_sync:
            raise ValueError(f"--batch_size={config.batch_size} must be divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas")
        overrides = dict(config.model_overrides)
        if config.reference_mode:
            overrides.setdefault("initializer", "reference")
        overrides.setdefault("max_len", spec.max_len)
        if distributed:
            overrides["synchronized_batch_norm"] = True
        self.model_config = make_config(config.preset, spec.num_items, spec.num_categories, **overrides)
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            self.model = DareModel(self.model_config, seed=seed, name=config.preset)
            self.model.build()
            self.optimizer = make_optimizer(config.optimizer, config.learning_rate)
            self.optimizer.build(self.model.trainable_variables)
        # Loop bookkeeping lives outside the strategy: plain host-side variables.
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.best_auc = tf.Variable(-1.0, dtype=tf.float64, trainable=False, name="best_val_auc")
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step,
                                              best_auc=self.best_auc, best_step=self.best_step)
        # Non-chief workers save too (checkpointing is collective), into their own scratch
        # directory, where they also keep their copy of the best weights.
        self.work_dir = run_dir if chief else os.path.join(run_dir, f".worker-{_task_id(strategy)}")
        os.makedirs(self.work_dir, exist_ok=True)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(self.work_dir, "checkpoints"), max_to_keep=2)
        count = spec.counts["train"]
        self.steps_per_epoch = count // config.batch_size if distributed else math.ceil(count / config.batch_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{data_dir}: the train split is empty")
        self.total_steps = self.steps_per_epoch * config.epochs
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self._build_steps(distributed)

    # -- compiled steps ----------------------------------------------------
    def _build_steps(self, distributed: bool) -> None:
        model = self.model
        self.train_step = make_train_step(model, self.optimizer, self.strategy,
                                          jit_compile=self.config.jit_compile and not distributed)
        # Tables that LazyAdam updates row by row are read row by row (see gather_rows).
        sparse = getattr(self.optimizer, "sparse_updates", False)
        self.statistics_step = make_statistics_step(
            model, self.strategy, jit_compile=self.config.jit_compile and not distributed, sparse_reads=sparse)
        bn_training = self.config.reference_mode  # the reference never enters inference mode

        @tf.function(jit_compile=self.config.jit_compile, autograph=False)
        def forward(x, gathered):
            return model.forward(x, training=bn_training, gathered=gathered)["probability"]

        self.predict = tf.function(
            lambda x: forward(x, model.lookup_embeddings(x, sparse_reads=True) if sparse else None),
            autograph=False)

    # -- data ------------------------------------------------------------------
    def _epoch_dataset(self, epoch: int, skip: int):
        """This epoch's batches (order fixed by seed and epoch), `skip` already trained."""
        return self._train_batches(self.seed * 1000 + epoch, self.config.shuffle_buffer, skip=skip)

    def _train_batches(self, seed: int, shuffle_buffer: int, skip: int = 0, take: int | None = None):
        """Training batches in an order fixed by `seed`.

        Distributed, every input pipeline reads the same global batches and
        keeps its slice of each, so N workers together train on exactly the
        global batch one process would (the last partial batch is dropped).
        """
        cfg = self.config

        def dataset_fn(context=None):
            ds = make_dataset(self.data_dir, "train", cfg.batch_size, shuffle=True,
                              shuffle_buffer=shuffle_buffer, deterministic=True, seed=seed,
                              spec=self.spec, drop_remainder=context is not None)
            if skip:
                ds = ds.skip(skip)
            if take is not None:
                ds = ds.take(take)
            if context is None:
                return ds
            size = cfg.batch_size // context.num_input_pipelines
            lo = context.input_pipeline_id * size
            ds = ds.map(lambda x, y: (tf.nest.map_structure(lambda t: t[lo: lo + size], x), y[lo: lo + size]))
            return ds.rebatch(context.get_per_replica_batch_size(cfg.batch_size))

        if not self.distributed:
            return dataset_fn()
        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def evaluate(self, split: str) -> dict[str, float]:
        ds = make_dataset(self.data_dir, split, self.config.eval_batch_size, shuffle=False,
                          drop_remainder=self.config.reference_mode, deterministic=True, spec=self.spec)
        labels, probs, users, cats = [], [], [], []
        for x, y in ds:
            probs.append(self.predict({k: x[k] for k in INPUT_KEYS}).numpy())
            labels.append(y.numpy())
            users.append(x["uid"].numpy())
            cats.append(x["target_category"].numpy())
        if not labels:
            raise ValueError(f"{self.data_dir}: the {split} split has no complete batch of "
                             f"{self.config.eval_batch_size}")
        return metrics.evaluate(*(np.concatenate(a) for a in (labels, probs, users, cats)))

    # -- history -----------------------------------------------------------------
    def _history_path(self) -> str:
        return os.path.join(self.run_dir, HISTORY)

    def read_history(self) -> list[dict]:
        if not os.path.exists(self._history_path()):
            return []
        with open(self._history_path()) as f:
            return [json.loads(line) for line in f if line.strip()]

    def _truncate_history(self, step: int) -> None:
        kept = [h for h in self.read_history() if h["step"] <= step]
        if self.chief:
            tmp = self._history_path() + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(h) + "\n" for h in kept)
            os.replace(tmp, self._history_path())

    def _append_history(self, entry: dict) -> None:
        if self.chief:
            with open(self._history_path(), "a") as f:
                f.write(json.dumps(entry, default=float) + "\n")

    # -- the loop ------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.config
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
            logging.info("seed %d: resumed from %s at step %d", self.seed, self.manager.latest_checkpoint,
                         int(self.step))
        self._truncate_history(int(self.step))
        writer = tf.summary.create_file_writer(os.path.join(self.run_dir, "tensorboard")) if self.chief \
            else tf.summary.create_noop_writer()
        step = int(self.step)
        bar = tqdm(total=self.total_steps, initial=step, desc=f"{cfg.preset} seed {self.seed}",
                   disable=None, dynamic_ncols=True)
        started = time.perf_counter()
        while step < self.total_steps:
            epoch, in_epoch = divmod(step, self.steps_per_epoch)
            for x, y in self._epoch_dataset(epoch, in_epoch):
                loss = float(self.train_step({k: x[k] for k in INPUT_KEYS}, y))
                step += 1
                self.step.assign(step)
                if not math.isfinite(loss):
                    raise NonFiniteLossError(
                        f"training loss became {loss} at step {step} (epoch {epoch}, seed {self.seed}) of "
                        f"{cfg.preset}; lower --learning_rate or check the data")
                bar.update(1)
                if step % cfg.log_every == 0 or step == 1:
                    bar.set_postfix(loss=f"{loss:.4f}")
                    with writer.as_default():
                        tf.summary.scalar("train/loss", loss, step=step)
                end_of_epoch = step % self.steps_per_epoch == 0
                if step % cfg.eval_every == 0 or step == self.total_steps or end_of_epoch:
                    self._checkpoint_and_evaluate(step, epoch, loss, writer, time.perf_counter() - started)
                if step >= self.total_steps or end_of_epoch:
                    break
        bar.close()
        return self._finish()

    def refresh_batch_norm_statistics(self) -> None:
        """Sets BatchNorm's moving statistics to the average batch statistics of
        `bn_statistics_batches` training batches (in a fixed order) under the
        current weights; no weight changes."""
        cfg = self.config
        if cfg.reference_mode or not cfg.bn_statistics_batches:
            return
        # A small shuffle buffer: a mixed sample of the training split, cheap to fill.
        batches = self._train_batches(self.seed * 1000 + 999, min(cfg.shuffle_buffer, 8 * cfg.batch_size),
                                      take=cfg.bn_statistics_batches)
        for i, (x, _) in enumerate(batches, start=1):
            self.statistics_step({k: x[k] for k in INPUT_KEYS}, tf.constant(1.0 / i, tf.float32))

    def _checkpoint_and_evaluate(self, step, epoch, loss, writer, seconds) -> None:
        self.refresh_batch_norm_statistics()
        val = self.evaluate("val")
        improved = val["auc"] > float(self.best_auc)
        if improved:
            self.best_auc.assign(val["auc"])
            self.best_step.assign(step)
            tmp = os.path.join(self.work_dir, "best.tmp.weights.h5")
            self.model.save_weights(tmp)
            os.replace(tmp, os.path.join(self.work_dir, BEST_WEIGHTS))
        with writer.as_default():
            for name, value in val.items():
                tf.summary.scalar(f"val/{name}", value, step=step)
        # History first, then the checkpoint: a kill between the two re-runs
        # these steps, and resuming drops history lines past the checkpoint.
        self._append_history({"step": step, "epoch": epoch, "train_loss": loss, "val": val,
                              "best": improved, "seconds": seconds})
        self.manager.save(checkpoint_number=step)
        logging.info("seed %d step %d: val %s%s", self.seed, step,
                     {k: round(v, 5) for k, v in val.items()}, " (best)" if improved else "")

    def _finish(self) -> dict:
        best = os.path.join(self.work_dir, BEST_WEIGHTS)
        if os.path.exists(best):
            self.model.load_weights(best)
        history = self.read_history()
        best_entry = next((h for h in history if h["step"] == int(self.best_step)), None)
        result = {
            "seed": self.seed,
            "steps": int(self.step),
            "best_step": int(self.best_step),
            "val": best_entry["val"] if best_entry else self.evaluate("val"),
            "test": self.evaluate("test"),
            "model_config": self.model_config.to_dict(),
        }
        if self.chief:
            _atomic_json(os.path.join(self.run_dir, SEED_RESULT), result)
            self.model.save(os.path.join(self.run_dir, "model.keras"))
        return result


def summarize(per_seed: list[dict]) -> dict:
    out = {}
    for split in ("val", "test"):
        values = {m: np.array([r[split][m] for r in per_seed], float) for m in METRICS}
        out[split] = {m: float(v.mean()) for m, v in values.items()}
        out[f"{split}_std"] = {m: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for m, v in values.items()}
    return out


def train(data_dir: str, output_dir: str, config: TrainConfig,
          strategy: tf.distribute.Strategy | None = None) -> dict:
    """Trains every seed of `config` (resuming or skipping finished ones) and
    writes `output_dir/results.json`; returns its content."""
    spec = DatasetSpec.load(data_dir)
    strategy = strategy or make_strategy(config.strategy)
    chief = _is_chief(strategy)
    os.makedirs(output_dir, exist_ok=True)
    per_seed = []
    for seed in config.seeds:
        run_dir = os.path.join(output_dir, f"seed_{seed}")
        done = os.path.join(run_dir, SEED_RESULT)
        if os.path.exists(done):
            with open(done) as f:
                per_seed.append(json.load(f))
            logging.info("seed %d: already finished, reusing %s", seed, done)
            continue
        per_seed.append(_SeedRun(data_dir, run_dir, config, seed, spec, strategy, chief).run())
    results = {
        "data_dir": os.path.abspath(data_dir),
        "dataset": spec.dataset,
        "config": dataclasses.asdict(config),
        "seeds": list(config.seeds),
        **summarize(per_seed),
        "per_seed": per_seed,
    }
    if chief:
        _atomic_json(os.path.join(output_dir, RESULTS), results)
    return results
