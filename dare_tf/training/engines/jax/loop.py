"""The trainer on Keras's JAX backend (`KERAS_BACKEND=jax`), with no TensorFlow.

The same run as on TensorFlow (`dare_tf.training.engines.tensorflow.loop`): the same flags, run
directory, `results.json`, `history.jsonl`, best-weights selection, warnings,
curves, seeds and resume after a kill; the same examples in the same order
(the train split's permutations, `InMemorySplit.epoch_order`). What differs:

- input: the shards are read by the package's own decoder
  (`dare_tf.data.storage.wire`), the store held in the devices' memory and
  each window gathered inside the jitted step (`device_input.DeviceSplit`); a
  split whose example columns fit `--in_memory_mb` is held there too, a larger
  one streamed from its shards (`dare_tf.data.feeding.shard_stream`), each
  call's examples placed ahead of it by a background thread
  (`device_input.StreamedInput`), every epoch's full batches;
- steps: `steps_per_execution` steps per call of one jitted function (a
  `lax.scan` over the steps' example indices) that runs Keras's own
  `compute_loss_and_updates` and the optimizer's `stateless_apply`, its state
  donated; the losses are read at each validation, where a non-finite one
  stops the run naming its step;
- checkpoints: `checkpoints/ckpt-<step>.npz` (`JaxCheckpoints`), every model and
  optimizer variable with the best metric and its step; the last two kept;
- distribution: `keras.distribution` (`distribution.distribution_for`)
  instead of `tf.distribute`, whose strategies are refused in one line naming
  the alternative (`distribution.refusal`).

A ranker trained in its cascade reads the candidates its retrieval run wrote
(`dare_tf.retrieval.candidate_files`), as on TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

import jax
import keras
import numpy as np

from dare_tf._faces import public
from dare_tf._files import require_space, variables_bytes
from dare_tf._startup import set_random_seed
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.feeding.shard_stream import ShardStream
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.store import load_store
from dare_tf.model.dare_model import DareModel
from dare_tf.run_directory import BEST_WEIGHTS
from dare_tf.training.callbacks import ExactValidation, KeepBestWeights, NonFiniteLossError
from dare_tf.training.config import TrainConfig, effective_model_config
from dare_tf.training.memory import out_of_memory
from dare_tf.training.continuation import Continuation
from dare_tf.training.engines.jax.device_input import DeviceSplit, StreamedInput
from dare_tf.training.engines.jax.distribution import (EveryJaxProcess, Placement, distribution_for,
                                                       peers_lost_end_the_process, refusal, use_compilation_cache)
from dare_tf.training.engines.jax.state import Scalar, StepFunctions
from dare_tf.training.evaluation import evaluation_batch
from dare_tf.training.input_plan import InputPlan
from dare_tf.training.checkpoints import JaxCheckpoints
from dare_tf.training.progress import TensorBoardScalars
from dare_tf.training.reranking import Cascade
from dare_tf.training.seed_run import SeedRunBase, click_task
from dare_tf.training.seeds import run_seeds, save_seed


@public("dare_tf.training")
class JaxSeedRun(SeedRunBase):
    """One seed's run on JAX (`SeedRunBase`'s engine part): its device input, jitted
    step and evaluation functions (`state.StepFunctions`), its checkpoints and
    the callbacks it calls itself; `run()` trains (resuming from the latest
    checkpoint) and returns the seed's result."""

    def __init__(self, data_dir: str, run_dir: str, config: TrainConfig, seed: int, spec: DatasetSpec,
                 model_config, memory: dict[str, InMemorySplit], placement: Placement, chief: bool,
                 report: Callable[[str], None], continuation: Continuation | None = None, streams=None,
                 cascade: Cascade | None = None):
        self.data_dir, self.run_dir, self.config, self.seed, self.spec = data_dir, run_dir, config, seed, spec
        self.model_config, self.placement, self.chief, self._print = model_config, placement, chief, report
        self.continuation, self.cascade = continuation, cascade
        self.work_dir = run_dir if chief else os.path.join(run_dir, f".process-{jax.process_index()}")
        os.makedirs(self.work_dir, exist_ok=True)
        # The schedule and the training order (a cascade's drawn negatives too) are TensorFlow's in-memory ones.
        self.plan = InputPlan(data_dir, config, seed, spec, None, model_config.max_len, memory, cascade,
                              fields=model_config.fields)
        self.memory = self.plan.memory
        if config.schedule.batch_size % placement.batch_shards:
            raise ValueError(f"batch_size={config.schedule.batch_size} must be divisible by the "
                             f"{placement.batch_shards} devices the batch is split over")
        set_random_seed(seed)  # (without loading TensorFlow)
        self.model = DareModel(model_config, seed=seed, name=config.preset)
        self.model.task = click_task(config)
        self.model.build()
        self.model.compile(optimizer=keras.optimizers.Adam(config.optimizer.learning_rate))
        self.model.optimizer.build(self.model.trainable_variables)
        # The store on the devices once; each split held there on it, or streamed (`streams`) onto it.
        template = DeviceSplit(None, placement.replicate, store=load_store(data_dir, spec),
                               max_len=model_config.max_len)
        self.splits = {name: template.with_columns(split.columns) for name, split in self.memory.items()}
        self.streamed = {name: StreamedInput(stream, template) for name, stream in (streams or {}).items()}
        self.functions = StepFunctions(self.model, self.splits.get("train", template), placement,
                                       lazy=config.optimizer.name == "lazy_adam")
        self.best_auc, self.best_step = Scalar(-1.0), Scalar(-1)
        self.checkpoints = JaxCheckpoints(os.path.join(self.work_dir, "checkpoints"))
        self.started = time.perf_counter()

    # -- evaluation ----------------------------------------------------------------------
    def predict(self, split: str) -> dict[str, np.ndarray]:
        """`predict_split`'s arrays (labels, probabilities, users, categories,
        history lengths) over the whole split, with the current state."""
        counts = [len(self.memory[s]) if s in self.memory else len(self.streamed[s].stream) for s in ("val", "test")
                  if s in self.memory or s in self.streamed]
        size = evaluation_batch(self.config, self.model_config.max_len, counts)
        if split in self.splits:
            return self.functions.predict(self.splits[split], size, self.config.reference_mode)
        rows = max(1, self.config.data.shuffle_buffer // size) * size  # (a streamed split: chunk by chunk)
        parts = [self.functions.predict(chunk, size, self.config.reference_mode)
                 for chunk in self.streamed[split].in_order(rows)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def refresh_batch_norm_statistics(self) -> None:
        """BatchNorm's moving statistics from the plan's `bn_statistics_batches` training batches
        (as on TensorFlow: the rows of the permutation of epoch 999)."""
        cfg = self.config
        batch, wanted = cfg.schedule.batch_size, self.plan.bn_statistics_batches
        if cfg.reference_mode or not wanted:
            return
        if "train" in self.streamed:  # (the first batches of epoch 999's order, streamed)
            count = min(wanted, len(self.streamed["train"].stream) // batch)
            split, rows = self.streamed["train"].epoch_start(self.seed, 999, count, batch)
            self.functions.refresh_batch_norm(rows, split)
            return
        order = self.memory["train"].epoch_order(self.seed, 999)[: wanted * batch]
        self.functions.refresh_batch_norm(order[: len(order) // batch * batch].reshape(-1, batch))

    def cascade_metrics(self, split: str, retrieval: bool = True) -> dict[str, float]:
        """The cascade's metrics of `split` with the model's current weights; {} without a retrieval run."""
        if self.cascade is None or split not in self.cascade.examples:
            return {}
        return self.cascade.examples[split].metrics(self.model, retrieval)

    def cascade_test_metrics(self) -> dict | None:
        return self.cascade_metrics("test") or None

    def callbacks(self) -> list:
        validation = ExactValidation(lambda: (self.functions.sync(), self.refresh_batch_norm_statistics()),
                                     lambda: self.predict("val"), lambda: self.cascade_metrics("val", False))
        callbacks = [validation, KeepBestWeights(os.path.join(self.work_dir, BEST_WEIGHTS), self.best_auc,
                                                 self.best_step, self.config.cascade.selection)]
        callbacks += self.chief_callbacks()
        for callback in callbacks:
            callback.set_model(self.model)
        return callbacks

    def engine_title(self) -> str:
        return f" (JAX, {self.placement.describe()})"

    # -- the run -------------------------------------------------------------------------
    def calls(self, skip: int) -> list[int]:
        """The steps of each call of the jitted step from step `skip` on: up to
        `steps_per_execution` at a time, none across a validation."""
        plan, chunk, calls, done = self.plan, self.config.execution_steps(self.plan.eval_every), [], skip
        while done < plan.total_steps:
            between = min(plan.eval_every - done % plan.eval_every, plan.total_steps - done)
            calls += [min(chunk, between - first) for first in range(0, between, chunk)]
            done += between
        return calls

    def batches(self, skip: int, calls: list[int]):
        """`(split, rows)` of each call: `rows` `[S, batch]` indices into `split`
        (None: the train split held on the devices)."""
        batch = self.config.schedule.batch_size
        if "train" in self.streamed:
            return self.streamed["train"].training(self.seed, self.config.schedule.epochs,
                                                   self.plan.steps_per_epoch * batch, skip * batch, calls, batch)
        order = self.plan.memory_order(skip).reshape(-1, batch)
        ends = np.cumsum(calls)
        return ((None, order[end - steps: end]) for steps, end in zip(calls, ends))

    def restore(self) -> bool:
        extra = self.checkpoints.restore_latest(self.functions.variables(), self._print,
                                                EveryJaxProcess() if jax.process_count() > 1 else None)
        if extra is not None:
            self.best_auc.assign(extra["best_auc"])
            self.best_step.assign(extra["best_step"])
        return extra is not None

    def train(self, step: int) -> None:
        try:
            self._train(step)
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            raise out_of_memory(self.model_config, self.config.schedule.batch_size, e) from None
        finally:
            self.checkpoints.wait()  # (the last checkpoint written in the background)

    def _train(self, step: int) -> None:
        callbacks, functions, plan = self.callbacks(), self.functions, self.plan
        functions.load()
        for callback in callbacks:
            callback.on_train_begin()
        calls = self.calls(step)
        batches = self.batches(step, calls)
        losses, done = [], step
        while done < plan.total_steps:
            between = min(plan.eval_every - done % plan.eval_every, plan.total_steps - done)
            while sum(len(x) for x in losses) < between:
                split, rows = next(batches)
                losses.append(functions.train(rows, split))
            done += between
            self.model.optimizer.iterations.assign(done)  # (what the callbacks read; the state holds it too)
            for callback in callbacks:
                callback.on_train_batch_end(done % plan.eval_every or plan.eval_every)
            values = np.concatenate([np.asarray(x) for x in losses])
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                at = done - len(values) + int(bad[0]) + 1
                raise NonFiniteLossError(f"training loss became {values[bad[0]]} at step {at} (epoch "
                                         f"{(at - 1) // plan.steps_per_epoch}, seed {self.seed} of "
                                         f"{self.config.preset}); lower --learning_rate or check the data")
            logs = {"loss": float(values.mean())}
            losses = []
            for callback in callbacks:
                if isinstance(callback, TensorBoardScalars):
                    callback.write_losses(done, values)
                callback.on_epoch_end(done // plan.eval_every - 1, logs)
            require_space(self.checkpoints.directory, 2 * variables_bytes(functions.variables()), "a checkpoint")
            self.checkpoints.save(done, functions.variables(), best_auc=float(self.best_auc),
                                  best_step=int(self.best_step))

    def weights_loaded(self) -> None:
        self.functions.load()

    def save(self, result: dict, kept_step: int) -> None:
        # Every process saves (saving builds variables under the distribution: a collective each joins),
        # the others into their own scratch directory.
        save_seed(self.work_dir, self.model, result, kept_step, self.config, self.model_config, self.seed)


@public("dare_tf.training")
def train_on_jax(data_dir: str, output_dir: str, config: TrainConfig, overwrite: bool = False,
                 report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """`dare_tf.training.train` on Keras's JAX backend: every seed of `config`,
    `output_dir/results.json` written and returned."""
    from dare_tf.run_directory import RunDirectory
    from dare_tf.training.seeds import trainable_spec

    problem = refusal(config)
    if problem:
        raise ValueError(problem)
    use_compilation_cache(config.runtime.compilation_cache)
    spec = trainable_spec(data_dir)
    placement = Placement(distribution_for(config.runtime))
    model_config = placement.fit_model_config(effective_model_config(config, spec, None))
    continuation = (Continuation.load(config.init_from, config.preset, model_config, data_dir)
                    if config.init_from else None)
    chief = jax.process_index() == 0
    loaded: dict = {}
    streams: dict = {}
    cascade: list = []

    def train_seed(seed: int, run_dir: str) -> dict:
        if not loaded and not streams:  # once, for the first seed that trains
            for split in ("train", "val", "test"):
                if InMemorySplit.estimated_bytes(spec, split) <= config.data.in_memory_mb * 2**20:
                    loaded[split] = InMemorySplit.load(data_dir, split, spec, model_config.max_len)
                else:  # (streamed from its shards, as on TensorFlow)
                    streams[split] = ShardStream(data_dir, split, spec, load_store(data_dir, spec),
                                                 shuffle_buffer=config.data.shuffle_buffer)
            cascade.append(Cascade.load(data_dir, spec, config, model_config.max_len, None, loaded))
        with placement.scope():
            return JaxSeedRun(data_dir, run_dir, config, seed, spec, model_config, loaded, placement, chief,
                              report, continuation, streams, cascade[0]).run()

    with RunDirectory(output_dir).lock() if chief else contextlib.nullcontext(), peers_lost_end_the_process():
        return {**run_seeds(data_dir, output_dir, config, spec, model_config, chief, overwrite, flags_text,
                            continuation, train_seed, backend="jax"), "chief": chief}

