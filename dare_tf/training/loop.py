"""The training loop: one `SeedRun` per seed, and `train` over a config's seeds."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from dare_tf.data.pipeline import InMemorySplit, make_dataset
from dare_tf.data.spec import MODEL_INPUTS, DatasetSpec
from dare_tf.models import DareModel
from dare_tf.optimizers import make_optimizer
from dare_tf._files import atomic_json, require_space, variables_bytes
from dare_tf.run_directory import BEST_WEIGHTS, MODEL, SEED_RESULT, RunDirectory, read_history
from dare_tf.training.callbacks import (AppendHistory, ExactValidation, KeepBestWeights, RunProgress,
                                        SaveCheckpoint, ScalarWriters, StopAtStep, StopOnNonFiniteLoss,
                                        TensorBoardScalars, truncate_history)
from dare_tf.training.config import (EVAL_BEHAVIOURS, TrainConfig, effective_model_config,
                                     identity_check, run_identity)
from dare_tf.training.diagnostics import default_eval_every, run_warnings, schedule_warnings, seed_warnings
from dare_tf.training.distribution import (ClusterError, fit_distributed, is_chief, task_id, gather_workers,
                                           make_strategy, worker_index, worker_partitions)
from dare_tf.tasks import ClickTask
from dare_tf.training.reranking import Cascade
from dare_tf.training.evaluation import (evaluate_outputs, metrics_by_history_length, predict_batches,
                                         predict_split, refresh_batch_norm_statistics, summarize)


class SeedRun:
    """One seed: its model, optimizer, checkpoint, input stream and history."""

    def __init__(self, data_dir: str, run_dir: str, config: TrainConfig, seed: int, spec: DatasetSpec,
                 strategy, chief: bool, model_config, report: Callable[[str], None],
                 memory: dict[str, InMemorySplit] | None = None, cascade: Cascade | None = None):
        self.data_dir, self.run_dir, self.config, self.seed = data_dir, run_dir, config, seed
        self.memory = dict(memory or {})
        self.cascade = cascade
        if cascade is not None and cascade.sampler is not None:  # this seed's drawn negatives, every epoch
            self.memory["train"] = cascade.train_split(seed, config.schedule.epochs, model_config.max_len)
        self.spec, self.strategy, self.chief, self.model_config = spec, strategy, chief, model_config
        self._print = report
        os.makedirs(run_dir, exist_ok=True)
        self.distributed = strategy.num_replicas_in_sync > 1 or config.runtime.strategy != "default"
        if self.distributed and config.schedule.batch_size % strategy.num_replicas_in_sync:
            raise ValueError(f"batch_size={config.schedule.batch_size} must be divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas")
        # Each worker reads its own partitions (users) of every split: per-worker input and
        # store memory ~1/W. Every worker runs the same steps per epoch: the fewest full
        # local batches any worker's partitions hold (the rest of a larger partition set is
        # left out of that epoch, a different rest each epoch as the order is reshuffled).
        self.worker, self.workers = worker_index(strategy)
        self.partitions = worker_partitions(spec, self.worker, self.workers)
        self.local_batch = config.schedule.batch_size // self.workers
        if self.workers > 1:
            if config.schedule.batch_size % self.workers:
                raise ValueError(f"batch_size={config.schedule.batch_size} must be divisible by the "
                                 f"{self.workers} workers")
            counts = [sum(spec.records(n) for n in spec.shard_files("train", worker_partitions(spec, w, self.workers)))
                      for w in range(self.workers)]
            if cascade is not None and cascade.sampler is not None:  # each click with its drawn negatives
                counts = [c // (1 + spec.protocol["negatives"]) * config.cascade.group for c in counts]
            self.steps_per_epoch = min(counts) // self.local_batch
            self.total_steps = self.steps_per_epoch * config.schedule.epochs
        else:
            count, batch = spec.counts["train"], config.schedule.batch_size
            if "train" in self.memory:
                count = self.memory["train"].per_epoch
            # In memory, the epochs' permutations run back to back, cut into full batches
            # (static shapes: LazyAdam's step ran 2x faster with them); streamed, every
            # epoch ends with its partial batch, dropped when distributed.
            self.steps_per_epoch = (count // batch if self.distributed or "train" in self.memory
                                    else math.ceil(count / batch))
            self.total_steps = (config.schedule.epochs * count // batch if "train" in self.memory
                                else self.steps_per_epoch * config.schedule.epochs)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{data_dir}: the train split has fewer examples ({spec.counts['train']}"
                             f"{'' if self.workers == 1 else ' over all workers; the fewest on one worker'}) "
                             f"than one batch ({self.local_batch} per {'worker' if self.workers > 1 else 'step'})")
        examples = sum(counts) if self.workers > 1 else count
        self.schedule_warnings = [] if config.schedule.max_steps is not None else schedule_warnings(
            self.total_steps, examples, config.schedule.batch_size, config.schedule.epochs)
        if config.schedule.max_steps is not None:
            self.total_steps = min(self.total_steps, config.schedule.max_steps)
        self.eval_every = config.schedule.eval_every or default_eval_every(self.total_steps)
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            # Row-wise updates need sparse table gradients; dense Adam updates every row
            # anyway and is faster with the lookups inside the compiled forward pass.
            self.model = DareModel(model_config, seed=seed, name=config.preset,
                                   jit_compile_dense=config.runtime.jit_compile,
                                   sparse_embedding_gradients=config.optimizer.name == "lazy_adam")
            self.model.task = ClickTask(group=config.cascade.group if config.cascade.loss == "softmax" else None)
            self.model.build()
            self.model.compile(optimizer=make_optimizer(config.optimizer.name, config.optimizer.learning_rate),
                               metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000)],
                               steps_per_execution=config.execution_steps(self.eval_every))
            self.model.optimizer.build(self.model.trainable_variables)
        self.best_auc = tf.Variable(-1.0, dtype=tf.float64, trainable=False, name="best_val_auc")
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer,
                                              best_auc=self.best_auc, best_step=self.best_step)
        # Non-chief workers save too (checkpointing is collective), into their own scratch
        # directory, where they also keep their copy of the best weights.
        self.work_dir = run_dir if chief else os.path.join(run_dir, f".worker-{task_id(strategy)}")
        os.makedirs(self.work_dir, exist_ok=True)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(self.work_dir, "checkpoints"), max_to_keep=2)
        self.started = time.perf_counter()

    # -- data ---------------------------------------------------------------------------
    def _permutation(self, epoch: int) -> np.ndarray:
        return self.memory["train"].epoch_order(self.seed, epoch)

    def _epoch_batches(self, epoch: int, shuffle_buffer: int | None = None):
        """Training batches of one pass over this worker's partitions, in an order
        fixed by seed and epoch (`steps_per_epoch` local batches)."""
        if "train" in self.memory:
            order = self._permutation(epoch)[: self.steps_per_epoch * self.local_batch if self.workers > 1 else None]
            return self.memory["train"].batches(order, self.local_batch)
        return make_dataset(self.data_dir, "train", self.local_batch, shuffle=True,
                            shuffle_buffer=shuffle_buffer or self.config.data.shuffle_buffer, deterministic=True,
                            seed=self.seed * 1000 + epoch, spec=self.spec, partitions=self.partitions,
                            drop_remainder=self.distributed,
                            max_len=self.model_config.max_len).take(self.steps_per_epoch)

    def train_stream(self, skip: int):
        """All training batches from step `skip` on, features and label; distributed,
        each input pipeline (worker) reads its own partitions."""
        batch = self.local_batch
        if "train" in self.memory:
            # Examples per epoch: the whole split, or a worker's equal share.
            per_epoch = self.steps_per_epoch * batch if self.workers > 1 else self.memory["train"].per_epoch
            first = skip * batch // per_epoch
            order = np.concatenate([self._permutation(e)[:per_epoch]
                                    for e in range(first, self.config.schedule.epochs)])
            start = skip * batch - first * per_epoch
            ds = self.memory["train"].batches(order[start: start + (self.total_steps - skip) * batch], batch)
        else:
            first = skip // self.steps_per_epoch
            ds = self._epoch_batches(first).skip(skip - first * self.steps_per_epoch)
            for epoch in range(first + 1, self.config.schedule.epochs):
                ds = ds.concatenate(self._epoch_batches(epoch))
            ds = ds.take(self.total_steps - skip)
        ds = ds.map(lambda x, y: ({k: x[k] for k in MODEL_INPUTS}, y))
        if not self.distributed:
            return ds.prefetch(tf.data.AUTOTUNE)
        per_replica = self.config.schedule.batch_size // self.strategy.num_replicas_in_sync

        def dataset_fn(context):
            if context.num_input_pipelines != self.workers:
                raise ValueError(f"{context.num_input_pipelines} input pipelines for {self.workers} workers")
            return ds.rebatch(per_replica)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    @property
    def eval_batch_size(self) -> int:
        cap = max(self.config.schedule.batch_size, EVAL_BEHAVIOURS // self.model_config.max_len)
        return min(self.config.data.eval_batch_size, cap)

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
        if cfg.reference_mode or not cfg.schedule.bn_statistics_batches:
            return
        # A small shuffle buffer: a mixed sample of the training split, cheap to fill.
        batches = self._epoch_batches(999, min(cfg.data.shuffle_buffer, 8 * cfg.schedule.batch_size))
        combine = (lambda stats: gather_workers(self.strategy, stats)) if self.workers > 1 else None
        refresh_batch_norm_statistics(
            self.model, (x for x, _ in batches.take(cfg.schedule.bn_statistics_batches)), combine)

    def cascade_metrics(self, split: str, retrieval: bool = True) -> dict[str, float]:
        """The cascade's metrics of `split` (`dare_tf.training.reranking`), of every
        worker's positives; {} without a retrieval run."""
        if self.cascade is None or split not in self.cascade.examples:
            return {}
        combine = (lambda arrays: gather_workers(self.strategy, arrays)) if self.workers > 1 else None
        return self.cascade.examples[split].metrics(self.model, retrieval, combine)

    def report(self, step: int, val: dict, improved: bool) -> None:
        self._print(f"{self.config.preset} on {self.spec.dataset} {os.path.basename(self.data_dir)} seed "
                    f"{self.seed}, step {step}/{self.total_steps}: validation "
                    + " ".join(f"{k} {v:.4f}" for k, v in val.items()) + (" (best)" if improved else ""))

    def callbacks(self) -> list:
        """The callbacks of this seed's `fit` (see `dare_tf.training.callbacks`)."""
        cfg = self.config
        validation = ExactValidation(self.refresh_batch_norm_statistics, lambda: self.predict("val"),
                                     lambda: self.cascade_metrics("val", retrieval=False))
        best = KeepBestWeights(validation, os.path.join(self.work_dir, BEST_WEIGHTS), self.best_auc, self.best_step,
                               cfg.cascade.selection)
        callbacks = [
            StopOnNonFiniteLoss(lambda s: f"epoch {(s - 1) // self.steps_per_epoch}, seed {self.seed} "
                                          f"of {cfg.preset}"),
            StopAtStep(self.eval_every, self.total_steps),
            validation,
            best,
        ]
        if self.chief:
            callbacks += [AppendHistory(validation, best, self.run_dir, self.steps_per_epoch, self.started,
                                        self.report if cfg.runtime.verbose == 2 else None),
                          TensorBoardScalars(os.path.join(self.run_dir, "tensorboard"), cfg.runtime.log_every,
                                             validation)]
            if cfg.runtime.verbose == 1:
                callbacks.append(RunProgress(f"{cfg.preset} on {os.path.basename(os.path.normpath(self.data_dir))}, "
                                             f"seed {cfg.seeds.index(self.seed) + 1} of {len(cfg.seeds)} (seed "
                                             f"{self.seed})", self.total_steps, validation, self._print))
        return callbacks + [SaveCheckpoint(self.manager)]

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> dict:
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
            logging.info("seed %d: resumed from %s at step %d", self.seed, self.manager.latest_checkpoint,
                         int(self.model.optimizer.iterations.numpy()))
        step = int(self.model.optimizer.iterations.numpy())
        if self.chief:
            truncate_history(self.run_dir, step)
        if step < self.total_steps:
            if self.chief and self._print is not None and self.seed == self.config.seeds[0]:
                for warning in self.schedule_warnings:  # before the run, which may be long for nothing
                    self._print(f"warning: {warning}")
            callbacks = self.callbacks()
            fit = fit_distributed if self.distributed else keras.Model.fit
            fit(self.model, self.train_stream(step), steps_per_epoch=self.eval_every,
                epochs=math.ceil(self.total_steps / self.eval_every), initial_epoch=step // self.eval_every,
                callbacks=callbacks, shuffle=False, verbose=0)  # progress: RunProgress
        return self._finish()

    def _finish(self) -> dict:
        steps = int(self.model.optimizer.iterations.numpy())
        best = os.path.join(self.work_dir, BEST_WEIGHTS)
        kept_step = steps  # the step whose weights the result is of
        if os.path.exists(best):
            self.model.load_weights(best)  # (the optimizer's state of that step too)
            kept_step = int(self.best_step)
        history = read_history(self.run_dir)
        best_entry = next((h for h in history if h["step"] == int(self.best_step)), None)
        test = self.predict("test")
        result = {
            "seed": self.seed,
            "steps": steps,
            "best_step": int(self.best_step),
            "val": best_entry["val"] if best_entry else evaluate_outputs(self.predict("val")),
            "test": evaluate_outputs(test),
            **({"test_cascade": self.cascade_metrics("test")} if self.cascade and self.cascade.examples else {}),
            "test_by_history_length": metrics_by_history_length(test, self.model_config.max_len),
            "model_config": self.model_config.to_dict(),
            "warnings": self.schedule_warnings + seed_warnings(history, self.total_steps, self.spec),
        }
        if self.chief:
            writers = ScalarWriters(os.path.join(self.run_dir, "tensorboard"))
            writers.write("test", result["test"], kept_step)  # (stamped at the kept weights' step)
            writers.hparams({**{f"train.{k}": v for k, v in self.config.flat().items() if k != "model_overrides"},
                             **{f"model.{k}": v for k, v in self.model_config.to_dict().items()}, "seed": self.seed})
            require_space(self.run_dir, variables_bytes(self.model.weights), f"the trained model ({MODEL})")
            self.model.save(os.path.join(self.run_dir, MODEL))
            atomic_json(os.path.join(self.run_dir, SEED_RESULT), result)
        return result


def train(data_dir: str, output_dir: str, config: TrainConfig,
          strategy: tf.distribute.Strategy | None = None, overwrite: bool = False,
          report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """Trains every seed of `config` (resuming or reusing finished ones) and
    writes `output_dir/results.json`; returns its content.

    `report` receives the progress lines (`verbose` 1 and 2); `flags_text`, the
    program's effective flags, is written to `output_dir/flags.txt` (a flagfile
    that reproduces the run)."""
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"the trainer runs on Keras's TensorFlow backend (tf.data input, TensorFlow checkpoints "
                         f"and distribution); KERAS_BACKEND is {keras.backend.backend()!r}: unset it, or train "
                         "with DareModel's own compile/fit on that backend (docs/library.md)")
    spec = DatasetSpec.load(data_dir)
    impressions = any(role == "label" for role, _ in spec.source.get("log", {}).get("columns", []))
    if spec.protocol.get("negatives") == 0 and not impressions:
        raise ValueError(f"{data_dir} was prepared with --negatives=0 from a click log: every example is a "
                         "click, so a ranker has nothing to tell apart and AUC is undefined; prepare it with "
                         "--negatives >= 1 (that dataset suits retrieval: trainers.train_retrieval)")
    strategy = strategy or make_strategy(config.runtime.strategy,
                                         join_timeout_s=config.runtime.join_timeout_s)
    chief = is_chief(strategy)
    # One writer per run directory: the chief holds its lock for the whole run; the
    # configuration check and the first write happen under it.
    try:
        with RunDirectory(output_dir).lock() if chief else contextlib.nullcontext():
            return _train(data_dir, output_dir, config, spec, strategy, chief, overwrite, report, flags_text)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError) as e:
        if worker_index(strategy)[1] == 1:
            raise
        raise ClusterError.of(e) from None


def _train(data_dir, output_dir, config, spec, strategy, chief, overwrite, report, flags_text) -> dict:
    model_config = effective_model_config(config, spec, strategy)
    identity = run_identity(config, model_config, spec)
    run_directory = RunDirectory(output_dir)
    if chief:
        run_directory.check("ranking", identity, overwrite, **identity_check())
        run_directory.start("ranking", identity, flags_text)
    memory, cascade = None, None
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
                      if InMemorySplit.estimated_bytes(spec, split, partitions) <= config.data.in_memory_mb * 2**20}
            cascade = Cascade.load(data_dir, spec, config, model_config.max_len, partitions, memory)
        per_seed.append(SeedRun(data_dir, run_dir, config, seed, spec, strategy, chief, model_config,
                                 report, memory, cascade).run())
    results = {"data_dir": os.path.abspath(data_dir), "dataset": spec.dataset, "config": identity["train_config"],
               "seeds": list(config.seeds), **summarize(per_seed), "per_seed": per_seed,
               "warnings": run_warnings(per_seed)}
    if chief:
        run_directory.write_results(results)
    return results
