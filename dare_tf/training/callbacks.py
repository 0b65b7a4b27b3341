"""The trainer's Keras callbacks, one concern each.

At the end of each Keras epoch (`eval_every` steps), in this order:
`ExactValidation` computes the exact validation metrics (into the epoch's logs
as `val_*`, for TensorBoard and the progress bar); `KeepBestWeights` saves the
weights when validation AUC improved; `AppendHistory` writes the history line
(and the `--verbose=2` report); `SaveCheckpoint` writes the checkpoint. History
comes before the checkpoint: a kill between the two re-runs those steps, and
resuming drops history lines past the checkpoint (`truncate_history`).
`TensorBoardScalars` writes the training loss and the exact validation metrics
at their true steps.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import keras

from dare_tf._files import require_space, strict_json, variables_bytes
from dare_tf.run_directory import HISTORY, read_history
from dare_tf.training.evaluation import evaluate_outputs


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


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
    """Exact validation metrics at the end of each Keras epoch: refreshes
    BatchNorm's statistics (`refresh()`), predicts the validation split
    (`predict()`, every example, all workers gathered) and puts the metrics into
    the epoch's logs as `val_*`. `last` holds the step, the metrics and the
    timing of the latest validation, for the callbacks after it. `extra()` adds
    metrics of its own (the cascade's, `dare_tf.training.reranking`)."""

    def __init__(self, refresh: Callable[[], None], predict: Callable[[], dict],
                 extra: Callable[[], dict] | None = None):
        super().__init__()
        self.refresh, self.predict, self.extra = refresh, predict, extra
        self.fit_started, self.evaluating, self.last = time.perf_counter(), 0.0, None

    def on_train_begin(self, logs=None):
        self.fit_started, self.evaluating = time.perf_counter(), 0.0

    def on_epoch_end(self, epoch, logs=None):
        started = time.perf_counter()
        self.refresh()
        refreshed = time.perf_counter()
        outputs = self.predict()
        val = evaluate_outputs(outputs)
        if self.extra is not None:
            val.update(self.extra())
        predicted = time.perf_counter()
        self.last = {"step": int(self.model.optimizer.iterations.numpy()), "val": val,
                     "train_loss": float((logs or {}).get("loss", float("nan"))),
                     "timing": {"train_seconds": started - self.fit_started - self.evaluating,
                                "bn_seconds": refreshed - started, "val_seconds": predicted - refreshed,
                                "val_examples": int(len(outputs["labels"]))}}
        if logs is not None:
            logs.update({f"val_{k}": v for k, v in val.items()})
        self.evaluating += time.perf_counter() - started


class KeepBestWeights(keras.callbacks.Callback):
    """Saves the weights to `path` whenever the validation metric `metric` (AUC by
    default; higher is better) improves on `best_auc` (a variable, checkpointed
    with the run, as `best_step` is; it holds the best value of `metric`)."""

    def __init__(self, validation: ExactValidation, path: str, best_auc, best_step, metric: str = "auc"):
        super().__init__()
        self.validation, self.path, self.best_auc, self.best_step = validation, path, best_auc, best_step
        self.metric, self.improved = metric, False

    def on_epoch_end(self, epoch, logs=None):
        last = self.validation.last
        self.improved = last["val"][self.metric] > float(self.best_auc)
        if self.improved:
            self.best_auc.assign(last["val"][self.metric])
            self.best_step.assign(last["step"])
            tmp = f"{self.path}.tmp-{os.getpid()}.weights.h5"
            require_space(os.path.dirname(self.path), variables_bytes(self.model.weights), "saving the best weights")
            try:
                self.model.save_weights(tmp)
                os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)


def truncate_history(seed_dir: str, step: int) -> None:
    """Drops the history lines past `step` (those of a killed run after its checkpoint)."""
    kept = [h for h in read_history(seed_dir) if h["step"] <= step]
    path = os.path.join(seed_dir, HISTORY)
    with open(path + ".tmp", "w") as f:
        f.writelines(strict_json(h) + "\n" for h in kept)
    os.replace(path + ".tmp", path)


class AppendHistory(keras.callbacks.Callback):
    """Appends each validation's line to `seed_dir/history.jsonl` (step, epoch,
    training loss, metrics, whether best, seconds since `started`, timing) and
    hands a one-line summary to `report` (None: no report)."""

    def __init__(self, validation: ExactValidation, best: KeepBestWeights, seed_dir: str, steps_per_epoch: int,
                 started: float, report: Callable[[int, dict, bool], None] | None = None):
        super().__init__()
        self.validation, self.best, self.seed_dir = validation, best, seed_dir
        self.steps_per_epoch, self.started, self.report = steps_per_epoch, started, report

    def on_epoch_end(self, epoch, logs=None):
        last = self.validation.last
        entry = {"step": last["step"], "epoch": last["step"] // self.steps_per_epoch,
                 "train_loss": last["train_loss"], "val": last["val"], "best": self.best.improved,
                 "seconds": time.perf_counter() - self.started, "timing": last["timing"]}
        with open(os.path.join(self.seed_dir, HISTORY), "a") as f:
            f.write(strict_json(entry) + "\n")
        if self.report is not None:
            self.report(last["step"], last["val"], self.best.improved)


class SaveCheckpoint(keras.callbacks.Callback):
    """Writes a checkpoint (`tf.train.CheckpointManager`) at each validation's step."""

    def __init__(self, manager):
        super().__init__()
        self.manager = manager

    def on_epoch_end(self, epoch, logs=None):
        require_space(self.manager.directory, variables_bytes(self.model.weights)
                      + variables_bytes(self.model.optimizer.variables), "a checkpoint (weights, optimizer slots)")
        self.manager.save(checkpoint_number=int(self.model.optimizer.iterations.numpy()))


class ScalarWriters:
    """TensorBoard event files under `log_dir`, one run (`train`, `validation`,
    `test`) per subdirectory; each `write` flushes."""

    def __init__(self, log_dir: str):
        self.log_dir, self.writers = log_dir, {}

    def write(self, name: str, values: dict, step: int) -> None:
        import tensorflow as tf

        if name not in self.writers:
            self.writers[name] = tf.summary.create_file_writer(os.path.join(self.log_dir, name))
        with self.writers[name].as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, float(value), step=step)
        self.writers[name].flush()

    def hparams(self, values: dict) -> None:
        """The run's hyperparameters (TensorBoard's HParams plugin), in the log
        directory's own event file; lists and None as text."""
        import tensorflow as tf
        from tensorboard.plugins.hparams import api as hp

        if "" not in self.writers:
            self.writers[""] = tf.summary.create_file_writer(self.log_dir)
        with self.writers[""].as_default():
            hp.hparams({k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()})
        self.writers[""].flush()


class TensorBoardScalars(keras.callbacks.Callback):
    """TensorBoard event files a reader can use, at the optimizer's true steps:
    `train/` gets the training loss every `log_every` steps, `validation/` the
    exact validation metrics (`ExactValidation`'s) at every validation.

    (Keras's `TensorBoard` callback with an integer `update_freq` writes an
    epoch's summaries only when the step count is a multiple of it, and it
    never sees the exact metrics.) The trainer adds the test metrics of the kept
    weights under `test/` with `ScalarWriters`."""

    def __init__(self, log_dir: str, log_every: int, validation: ExactValidation):
        super().__init__()
        self.scalars, self.log_every, self.validation = ScalarWriters(log_dir), log_every, validation

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if logs and "loss" in logs and step % self.log_every == 0:
            self.scalars.write("train", {"loss": logs["loss"]}, step)

    def on_epoch_end(self, epoch, logs=None):
        last = self.validation.last
        self.scalars.write("validation", last["val"], last["step"])


class RunProgress(keras.callbacks.Callback):
    """`--verbose=1`: a line naming the run ("dare on taobao_sample, seed 2 of 5"),
    one progress bar over the run's optimizer steps with its ETA (Keras's
    `Progbar`; a resumed run starts at its step), and each validation's results
    printed beneath it. (Keras's own bar counts a Keras "epoch", which here is
    `eval_every` steps, not a pass over the data.)"""

    def __init__(self, title: str, total_steps: int, validation: ExactValidation, write=print):
        super().__init__()
        self.title, self.total_steps, self.validation, self.write = title, total_steps, validation, write
        self.bar = None

    def on_train_begin(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self.write(f"{self.title}: steps {step + 1} to {self.total_steps}")
        self.bar = keras.utils.Progbar(self.total_steps, stateful_metrics=["loss"], unit_name="step")
        self.bar.update(step)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self.bar.update(step, [("loss", float(logs["loss"]))] if logs and "loss" in logs else None,
                        finalize=step >= self.total_steps)

    def on_epoch_end(self, epoch, logs=None):
        last = self.validation.last
        self.write(f"\n  validation at step {last['step']}: "
                   + " ".join(f"{k} {v:.4f}" for k, v in last["val"].items()))
