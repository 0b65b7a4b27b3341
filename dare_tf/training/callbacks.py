"""The trainer's Keras callbacks."""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import keras

from dare_tf.run_directory import BEST_WEIGHTS
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
    """At the end of each Keras epoch (`eval_every` steps): BatchNorm refresh,
    exact validation metrics, best weights, history line, checkpoint; the
    metrics go into the epoch's logs as `val_*` (TensorBoard, progress bar)."""

    def __init__(self, run):
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
