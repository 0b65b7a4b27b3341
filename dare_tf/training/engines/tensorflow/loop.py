"""The training loop: one `SeedRun` per seed (wiring its input plan, model,
evaluator and callbacks), and `train` over a config's seeds."""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Callable

import keras
import tensorflow as tf
from absl import logging

from dare_tf._faces import public
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.model.dare_model import DareModel
from dare_tf.optimizers import make_optimizer
from dare_tf.run_directory import BEST_WEIGHTS, RunDirectory
from dare_tf.training.callbacks import (ExactValidation, KeepBestWeights, SaveCheckpoint, StopAtStep,
                                        StopOnNonFiniteLoss)
from dare_tf.training.seed_run import SeedRunBase, click_task
from dare_tf.training.config import TrainConfig, effective_model_config
from dare_tf.training.memory import out_of_memory
from dare_tf.training.seeds import run_seeds, save_seed, trainable_spec
from dare_tf.training.checkpoints import DamagedCheckpointError, restore_newest_held
from dare_tf.training.continuation import Continuation
from dare_tf.training.engines.tensorflow.distribution import (ClusterError, EveryWorker, fit_distributed, is_chief,
                                                              make_strategy, task_id, worker_index,
                                                              worker_partitions)
from dare_tf.training.engines.tensorflow.evaluator import Evaluator
from dare_tf.training.engines.tensorflow.input import TensorFlowInput
from dare_tf.training.reranking import Cascade


@public("dare_tf.training")
class SeedRun(SeedRunBase):
    """One seed's run on TensorFlow (`SeedRunBase`'s engine part): the input plan
    (`TensorFlowInput`) as a tf.data stream, the model with its optimizer and
    `tf.train.Checkpoint`, the evaluator (`Evaluator`) and the callbacks of
    Keras's `fit`; `run()` trains (resuming from the checkpoint) and returns the
    seed's result."""

    def __init__(self, data_dir: str, run_dir: str, config: TrainConfig, seed: int, spec: DatasetSpec,
                 strategy, chief: bool, model_config, report: Callable[[str], None],
                 memory: dict[str, InMemorySplit] | None = None, cascade: Cascade | None = None,
                 continuation: Continuation | None = None):
        self.data_dir, self.run_dir, self.config, self.seed = data_dir, run_dir, config, seed
        self.continuation = continuation
        self.spec, self.strategy, self.chief, self.model_config = spec, strategy, chief, model_config
        self.cascade, self._print = cascade, report
        os.makedirs(run_dir, exist_ok=True)
        self.plan = TensorFlowInput(data_dir, config, seed, spec, strategy, model_config.max_len, memory, cascade,
                              model_config.fields)
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            optimizer = make_optimizer(config.optimizer.name, config.optimizer.learning_rate)
            self.model = DareModel(model_config, seed=seed, name=config.preset,
                                   jit_compile_dense=config.runtime.jit_compile,
                                   sparse_embedding_gradients=optimizer.sparse_gradients)
            self.model.task = click_task(config)
            self.model.build()
            self.model.compile(optimizer=optimizer,
                               metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000)],
                               steps_per_execution=config.execution_steps(self.plan.eval_every))
            self.model.optimizer.build(self.model.trainable_variables)
        self.evaluator = Evaluator(self.model, self.plan, cascade)
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

    def callbacks(self) -> list:
        """The callbacks of this seed's `fit` (see `dare_tf.training.callbacks`)."""
        cfg = self.config
        plan, evaluator = self.plan, self.evaluator
        validation = ExactValidation(evaluator.refresh_batch_norm_statistics, lambda: evaluator.predict("val"),
                                     lambda: evaluator.cascade_metrics("val", retrieval=False))
        best = KeepBestWeights(os.path.join(self.work_dir, BEST_WEIGHTS), self.best_auc, self.best_step,
                               cfg.cascade.selection)
        callbacks = [
            StopOnNonFiniteLoss(lambda s: f"epoch {(s - 1) // plan.steps_per_epoch}, seed {self.seed} "
                                          f"of {cfg.preset}"),
            StopAtStep(plan.eval_every, plan.total_steps),
            validation,
            best,
        ]
        return callbacks + self.chief_callbacks() + [SaveCheckpoint(self.manager)]

    # -- the run ---------------------------------------------------------------------------
    def _restore(self, path: str) -> str:
        """Restores the checkpoint `path` (every tensor read with its checksum; an older
        one restored after a damaged one sets every variable again)."""
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (tf.errors.OpError, IndexError) as e:  # (IndexError: a data file cut short)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {reason})") from None
        return path

    def restore(self) -> bool:
        steps = sorted(int(path.rsplit("-", 1)[1]) for path in self.manager.checkpoints)
        resumed = restore_newest_held(steps, lambda step: os.path.join(self.manager.directory, f"ckpt-{step}"),
                                      self._restore, self._print,
                                      EveryWorker(self.strategy) if self.plan.workers > 1 else None)
        if resumed is not None:
            logging.info("seed %d: resumed from %s at step %d", self.seed, resumed,
                         int(self.model.optimizer.iterations.numpy()))
        return resumed is not None

    def train(self, step: int) -> None:
        plan = self.plan
        fit = fit_distributed if plan.distributed else keras.Model.fit
        try:
            fit(self.model, plan.train_stream(step), steps_per_epoch=plan.eval_every,
                epochs=math.ceil(plan.total_steps / plan.eval_every), initial_epoch=step // plan.eval_every,
                callbacks=self.callbacks(), shuffle=False, verbose=0)  # progress: RunProgress
        except tf.errors.ResourceExhaustedError as e:
            raise out_of_memory(self.model_config, self.config.schedule.batch_size, e) from None

    def predict(self, split: str) -> dict:
        return self.evaluator.predict(split)

    def cascade_test_metrics(self) -> dict | None:
        return self.evaluator.cascade_metrics("test") if self.cascade and self.cascade.examples else None

    def save(self, result: dict, kept_step: int) -> None:
        if self.chief:
            save_seed(self.run_dir, self.model, result, kept_step, self.config, self.model_config, self.seed)


_STRATEGIES: dict = {}  # (a multi-worker strategy is made once a process)


def strategy_for(runtime) -> tf.distribute.Strategy:
    """The `tf.distribute` strategy of a run's `RuntimeConfig`, made once a process."""
    key = (runtime.strategy, runtime.cpu_devices, runtime.join_timeout_s)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = make_strategy(*key)
    return _STRATEGIES[key]


def train_on_tensorflow(data_dir: str, output_dir: str, config: TrainConfig, overwrite: bool = False,
                        report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """`dare_tf.training.train` on Keras's TensorFlow backend, under the configuration's
    strategy (`strategy_for`)."""
    spec = trainable_spec(data_dir)
    strategy = strategy_for(config.runtime)
    chief = is_chief(strategy)
    # One writer per run directory: the chief holds its lock for the whole run; the
    # configuration check and the first write happen under it.
    try:
        with RunDirectory(output_dir).lock() if chief else contextlib.nullcontext():
            return {**_train(data_dir, output_dir, config, spec, strategy, chief, overwrite, report, flags_text),
                    "chief": chief}
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError) as e:
        if worker_index(strategy)[1] == 1:
            raise
        raise ClusterError.of(e) from None


def _train(data_dir, output_dir, config, spec, strategy, chief, overwrite, report, flags_text) -> dict:
    model_config = effective_model_config(config, spec, strategy)
    continuation = (Continuation.load(config.init_from, config.preset, model_config, data_dir)
                    if config.init_from else None)
    loaded = {}

    def train_seed(seed: int, run_dir: str) -> dict:
        if not loaded:  # loaded once, for the first seed that trains: this worker's partitions
            partitions = worker_partitions(spec, *worker_index(strategy))
            loaded["memory"] = {
                split: InMemorySplit.load(data_dir, split, spec, model_config.max_len, partitions)
                for split in ("train", "val")
                if InMemorySplit.estimated_bytes(spec, split, partitions) <= config.data.in_memory_mb * 2**20}
            loaded["cascade"] = Cascade.load(data_dir, spec, config, model_config.max_len, partitions,
                                             loaded["memory"])
        return SeedRun(data_dir, run_dir, config, seed, spec, strategy, chief, model_config, report,
                       loaded["memory"], loaded["cascade"], continuation).run()

    return run_seeds(data_dir, output_dir, config, spec, model_config, chief, overwrite, flags_text, continuation,
                     train_seed, backend="tensorflow")
