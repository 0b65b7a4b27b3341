"""What a run shows while it trains: TensorBoard event files (`TensorBoardScalars`,
through `dare_tf.tensorboard_events.ScalarWriters`) and the `--verbose=1` progress bar (`RunProgress`), each
a Keras callback that reads the epoch's logs (`dare_tf.training.callbacks`), and a long
program's parts with their times (`Parts`, `make demo`'s)."""

from __future__ import annotations

import sys
import time

import keras
import numpy as np

from dare_tf._faces import public
from dare_tf.tensorboard_events import ScalarWriters
from dare_tf.training.callbacks import optimizer_step, validation_metrics


@public("dare_tf.training")
class TensorBoardScalars(keras.callbacks.Callback):
    """TensorBoard event files a reader can use, at the optimizer's true steps:
    `train/` gets the training loss every `log_every` steps, `validation/` the
    exact validation metrics (the logs' `val_*`) at every validation.

    (Keras's `TensorBoard` callback with an integer `update_freq` writes an
    epoch's summaries only when the step count is a multiple of it, and it
    never sees the exact metrics.) The trainer adds the test metrics of the kept
    weights under `test/` with `ScalarWriters`."""

    def __init__(self, log_dir: str, log_every: int):
        super().__init__()
        self.scalars, self.log_every = ScalarWriters(log_dir), log_every

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if logs and "loss" in logs and step % self.log_every == 0:
            self.scalars.write("train", {"loss": logs["loss"]}, step)

    def on_epoch_end(self, epoch, logs=None):
        self.scalars.write("validation", validation_metrics(logs), optimizer_step(self.model))

    def on_train_end(self, logs=None):
        self.close()

    def close(self) -> None:
        """Closes the event files (fit's end; the seed run's, however it ends)."""
        self.scalars.close()

    def write_losses(self, last_step: int, losses) -> None:
        """A loop that is not `fit` (the JAX engine's): the losses of the steps up to
        `last_step` since the last validation, written as `fit`'s logs give them (at
        each multiple of `log_every`, the mean since the last validation)."""
        means = np.cumsum(np.asarray(losses, np.float64)) / np.arange(1, len(losses) + 1)
        for step, mean in zip(range(last_step - len(losses) + 1, last_step + 1), means):
            if step % self.log_every == 0:
                self.scalars.write("train", {"loss": mean}, step)


LOSS_EXPLAINED = ("loss: the training objective, click cross entropy + auxiliary head's + L2, averaged over "
                  "the last steps; validation's logloss is the click cross entropy alone")


@public("dare_tf.training")
class RunProgress(keras.callbacks.Callback):
    """`--verbose=1`: a line naming the run ("dare on taobao_sample, seed 2 of 5")
    and what its `loss` is, progress over the run's optimizer steps, and each
    validation's results (the logs' `val_*`) printed beneath it. (Keras's own bar
    counts a Keras "epoch", which here is `eval_every` steps, not a pass over the data.)

    On a terminal (`terminal`, default: whether stdout is one), one bar with its
    ETA (Keras's `Progbar`; a resumed run starts at its step); otherwise (a pipe,
    a log file) a plain line at each tenth of the run, no terminal escapes."""

    LINES = 10  # plain lines over a run

    def __init__(self, title: str, total_steps: int, write=print, terminal: bool | None = None):
        super().__init__()
        self.title, self.total_steps, self.write = title, total_steps, write
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        self.bar, self._next_line, self._started, self._first = None, 0, 0.0, 0

    def on_train_begin(self, logs=None):
        step = optimizer_step(self.model)
        self.write(f"{self.title}: steps {step + 1} to {self.total_steps} ({LOSS_EXPLAINED})")
        if self.terminal:
            self.bar = keras.utils.Progbar(self.total_steps, stateful_metrics=["loss"], unit_name="step")
            self.bar.update(step)
        self._started, self._first = time.perf_counter(), step
        self._next_line = self._line_after(step)

    def _line_after(self, step: int) -> int:
        every = max(1, -(-self.total_steps // self.LINES))
        return min(self.total_steps, (step // every + 1) * every)

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        loss = float(logs["loss"]) if logs and "loss" in logs else None
        if self.bar is not None:
            self.bar.update(step, None if loss is None else [("loss", loss)], finalize=step >= self.total_steps)
        elif step >= self._next_line:
            self._next_line = self._line_after(step)
            elapsed = time.perf_counter() - self._started
            eta = elapsed / max(step - self._first, 1) * (self.total_steps - step)
            self.write(f"  step {step}/{self.total_steps} ({100 * step // self.total_steps}%), {elapsed:.0f}s, "
                       f"eta {eta:.0f}s" + ("" if loss is None else f", loss {loss:.4f}"))

    def on_epoch_end(self, epoch, logs=None):
        self.write(("\n" if self.bar is not None else "")
                   + f"  validation at step {optimizer_step(self.model)}: "
                   + " ".join(f"{k} {v:.4f}" for k, v in validation_metrics(logs).items()))


# Seconds between the lines that say a long part is still running.
HEARTBEAT_S = 30


class Parts:
    """A long program's parts (`make demo`'s), through `say`: each one's title, a line
    every `HEARTBEAT_S` seconds while it runs (a cascade evaluation or a gradient
    analysis prints nothing for minutes), and its elapsed time when the next
    begins; the whole program's at the end (`end`, which stops the heartbeat)."""

    def __init__(self, say, heartbeat_s: float = HEARTBEAT_S):
        import threading

        self.say, self.heartbeat_s = say, heartbeat_s
        self.began = self.mark = time.perf_counter()
        self.title = None
        self.stop = threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.stop.wait(self.heartbeat_s):
            if self.title is not None:
                self.say(f"(part {self.title.split('.')[0]} still running: {time.perf_counter() - self.mark:.0f} s)")

    def next(self, title: str | None) -> None:
        now = time.perf_counter()
        if self.title is not None:
            self.say(f"(part {self.title.split('.')[0]} took {now - self.mark:.0f} s)")
        self.title, self.mark = title, now
        if title is not None:
            self.say(f"== {title}")

    def end(self) -> None:
        self.next(None)
        self.stop.set()
        self.say(f"done in {(time.perf_counter() - self.began) / 60:.1f} minutes")
