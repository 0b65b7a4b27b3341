"""The trainer's Keras callbacks, one concern each.

At the end of each Keras epoch (`eval_every` steps), in this order:
`ExactValidation` computes the exact validation metrics and puts them into the
epoch's logs as `val_*` (`val_auc`, ...), with its timing (`TIMING` keys);
`KeepBestWeights` saves the weights when the selected `val_*` metric improved
and adds `improved` to the logs; `AppendHistory` writes the history line (and
the `--verbose=2` report); `SaveCheckpoint` writes the checkpoint. History
comes before the checkpoint: a kill between the two re-runs those steps, and
resuming drops history lines past the checkpoint (`truncate_history`).
`TensorBoardScalars` writes the training loss and the exact validation metrics
at their true steps.

The callbacks talk through Keras's logs only (as Keras's own
`ReduceLROnPlateau` reads `val_loss`), so any of them works after any callback
that writes those keys, and each reads the step from the model's optimizer.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import keras

from dare_tf._faces import public
from dare_tf._files import require_space, strict_json, variables_bytes
from dare_tf.run_directory import HISTORY, read_history
from dare_tf.training.evaluation import evaluate_outputs


@public("dare_tf.training")
class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


@public("dare_tf.training")
class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises `NonFiniteLossError` naming the step when the training loss becomes NaN or infinite."""

    def __init__(self, describe: Callable[[int], str]):
        super().__init__()
        self.describe = describe

    def on_train_batch_end(self, batch, logs=None):
        loss = float((logs or {}).get("loss", 0.0))
        if not math.isfinite(loss):
            step = optimizer_step(self.model)
            raise NonFiniteLossError(f"training loss became {loss} at step {step} ({self.describe(step)}); "
                                     "lower --learning_rate or check the data")


@public("dare_tf.training")
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


# The timing keys `ExactValidation` adds to an epoch's logs beside the `val_*` metrics.
TIMING = ("train_seconds", "bn_seconds", "val_seconds", "val_examples")
VALIDATION_PREFIX = "val_"


def validation_metrics(logs: dict) -> dict:
    """The exact validation metrics of an epoch's logs (`val_auc` -> `auc`, ...),
    without the timing keys."""
    return {k[len(VALIDATION_PREFIX):]: v for k, v in logs.items()
            if k.startswith(VALIDATION_PREFIX) and k not in TIMING}


def optimizer_step(model) -> int:
    return int(model.optimizer.iterations.numpy())


@public("dare_tf.training")
class ExactValidation(keras.callbacks.Callback):
    """Exact validation metrics at the end of each Keras epoch: refreshes
    BatchNorm's statistics (`refresh()`), predicts the validation split
    (`predict()`, every example, all workers gathered) and puts the metrics into
    the epoch's logs as `val_*`, with the seconds spent training since the last
    validation, refreshing and predicting, and the examples predicted (`TIMING`).
    `extra()` adds metrics of its own (the cascade's, `dare_tf.training.reranking`)."""

    def __init__(self, refresh: Callable[[], None], predict: Callable[[], dict],
                 extra: Callable[[], dict] | None = None):
        super().__init__()
        self.refresh, self.predict, self.extra = refresh, predict, extra
        self.fit_started, self.evaluating = time.perf_counter(), 0.0

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
        timing = (started - self.fit_started - self.evaluating, refreshed - started, predicted - refreshed,
                  int(len(outputs["labels"])))
        if logs is not None:
            logs.update({f"{VALIDATION_PREFIX}{k}": v for k, v in val.items()})
            logs.update(zip(TIMING, timing))
        self.evaluating += time.perf_counter() - started


@public("dare_tf.training")
class KeepBestWeights(keras.callbacks.Callback):
    """Saves the weights to `path` whenever the validation metric `metric` (the
    logs' `val_<metric>`, AUC by default; higher is better) improves on
    `best_auc` (a variable, checkpointed with the run, as `best_step` is; it
    holds the best value of `metric`). Adds `improved` (a bool) to the logs."""

    def __init__(self, path: str, best_auc, best_step, metric: str = "auc"):
        super().__init__()
        self.path, self.best_auc, self.best_step, self.metric = path, best_auc, best_step, metric

    def on_epoch_end(self, epoch, logs=None):
        value = logs[f"{VALIDATION_PREFIX}{self.metric}"]
        improved = value > float(self.best_auc)
        logs["improved"] = improved
        if improved:
            self.best_auc.assign(value)
            self.best_step.assign(optimizer_step(self.model))
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


@public("dare_tf.training")
class AppendHistory(keras.callbacks.Callback):
    """Appends each validation's line to `seed_dir/history.jsonl` (step, epoch,
    training loss, the logs' `val_*` metrics, whether best (`improved`),
    seconds since `started`, timing) and hands a one-line summary to `report`
    (None: no report)."""

    def __init__(self, seed_dir: str, steps_per_epoch: int, started: float,
                 report: Callable[[int, dict, bool], None] | None = None):
        super().__init__()
        self.seed_dir, self.steps_per_epoch, self.started, self.report = seed_dir, steps_per_epoch, started, report

    def on_epoch_end(self, epoch, logs=None):
        step, val, improved = optimizer_step(self.model), validation_metrics(logs), bool(logs.get("improved"))
        entry = {"step": step, "epoch": step // self.steps_per_epoch,
                 "train_loss": float(logs.get("loss", float("nan"))), "val": val, "best": improved,
                 "seconds": time.perf_counter() - self.started, "timing": {k: logs[k] for k in TIMING}}
        with open(os.path.join(self.seed_dir, HISTORY), "a") as f:
            f.write(strict_json(entry) + "\n")
        if self.report is not None:
            self.report(step, val, improved)


@public("dare_tf.training")
class SaveCheckpoint(keras.callbacks.Callback):
    """Writes a checkpoint (`tf.train.CheckpointManager`) at each validation's step."""

    def __init__(self, manager):
        super().__init__()
        self.manager = manager

    def on_epoch_end(self, epoch, logs=None):
        require_space(self.manager.directory, variables_bytes(self.model.weights)
                      + variables_bytes(self.model.optimizer.variables), "a checkpoint (weights, optimizer slots)")
        self.manager.save(checkpoint_number=optimizer_step(self.model))
