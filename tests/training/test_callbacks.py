"""The trainer's callbacks: a non-finite loss stops with its step; the others talk through Keras's logs."""

import pytest

from dare_tf.training import NonFiniteLossError, TrainConfig, train
from tests.training.common import files_held_open


@pytest.mark.engines
def test_nan_loss_stops_with_the_step(taobao, tmp_path):
    config = TrainConfig.create(preset="twin", batch_size=256, eval_batch_size=256, epochs=1, learning_rate=1e30,
                         max_steps=15, eval_every=100, model_overrides=dict(initializer="keras"), jit_compile=False,
                         verbose=0, log_every=1)
    with pytest.raises(NonFiniteLossError,
                       match=r"training loss became (nan|inf) at step \d+ \(epoch 0, seed 0 of twin\)"):
        train(taobao, str(tmp_path / "nan"), config)
    # A failed run closes its TensorBoard files too (on TensorFlow the first step's loss is written,
    # --log_every=1, before the loss turns; JAX's engine writes the losses at validations).
    assert files_held_open(tmp_path / "nan") == []


def _progress_lines(terminal: bool):
    import keras
    import numpy as np

    from dare_tf.training import RunProgress
    from dare_tf.training.callbacks import TIMING

    lines = []

    class Validate(keras.callbacks.Callback):  # what ExactValidation puts into the logs
        def on_epoch_end(self, epoch, logs=None):
            logs.update({"val_auc": 0.5 + epoch / 10, **dict.fromkeys(TIMING, 1.0)})

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((12, 2), np.float32), np.ones((12, 1), np.float32)
    progress = RunProgress("dare on taobao_sample, seed 2 of 3 (seed 1)", 6, lines.append, terminal=terminal)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Validate(), progress])
    return lines, progress


TITLE = ("dare on taobao_sample, seed 2 of 3 (seed 1): steps 1 to 6 (loss: the training objective, click cross "
         "entropy + auxiliary head's + L2, averaged over the last steps; validation's logloss is the click cross "
         "entropy alone)")


def test_run_progress_names_the_seed_shows_one_bar_over_the_run_and_validations_beneath():
    lines, progress = _progress_lines(terminal=True)
    assert lines == [TITLE, "\n  validation at step 3: auc 0.5000", "\n  validation at step 6: auc 0.6000"]
    assert progress.bar.target == 6 and progress.bar._seen_so_far == 6  # one bar over the run's steps


def test_run_progress_into_a_pipe_writes_plain_lines_without_terminal_escapes(capsys):
    import re

    lines, progress = _progress_lines(terminal=False)
    assert progress.bar is None and "\x1b" not in "".join(lines) + capsys.readouterr().out
    plain = [re.sub(r"\d+s", "Ns", re.sub(r"loss [-\d.]+", "loss X", line)) for line in lines]
    assert plain == [TITLE] + [f"  step {s}/6 ({100 * s // 6}%), Ns, eta Ns, loss X" for s in (1, 2, 3)] + [
        "  validation at step 3: auc 0.5000"] + [f"  step {s}/6 ({100 * s // 6}%), Ns, eta Ns, loss X"
                                                 for s in (4, 5, 6)] + ["  validation at step 6: auc 0.6000"]


def test_callbacks_read_each_other_through_the_logs_only(tmp_path):
    """KeepBestWeights, AppendHistory and TensorBoardScalars after any callback that writes
    `val_*` (here a stand-in for ExactValidation): the history line, the best step and the
    TensorBoard scalars come from the logs."""
    import json

    import keras
    import numpy as np
    import tensorflow as tf

    from dare_tf.training.callbacks import TIMING, AppendHistory, KeepBestWeights
    from dare_tf.training.progress import TensorBoardScalars

    aucs = [0.6, 0.7, 0.65]

    class Validate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs.update({"val_auc": aucs[epoch], "val_logloss": 1.0 - aucs[epoch],
                         **{k: float(i) for i, k in enumerate(TIMING)}})

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    best_auc, best_step = tf.Variable(-1.0, dtype=tf.float64), tf.Variable(-1, dtype=tf.int64)
    reports = []
    callbacks = [Validate(), KeepBestWeights(str(tmp_path / "best.weights.h5"), best_auc, best_step),
                 AppendHistory(str(tmp_path), 3, 0.0, lambda *a: reports.append(a)),
                 TensorBoardScalars(str(tmp_path / "tb"), log_every=100)]
    model.fit(np.ones((8, 2), np.float32), np.ones((8, 1), np.float32), batch_size=4, epochs=3, verbose=0,
              callbacks=callbacks)
    history = [json.loads(line) for line in open(tmp_path / "history.jsonl")]
    assert [(h["step"], h["epoch"], h["best"]) for h in history] == [(2, 0, True), (4, 1, True), (6, 2, False)]
    assert history[0]["val"] == {"auc": 0.6, "logloss": 0.4} and history[0]["timing"] == {
        "train_seconds": 0.0, "bn_seconds": 1.0, "val_seconds": 2.0, "val_examples": 3.0}
    assert (float(best_auc), int(best_step)) == (0.7, 4) and (tmp_path / "best.weights.h5").exists()
    assert [r[0] for r in reports] == [2, 4, 6] and reports[2][2] is False
    events = tf.io.gfile.glob(str(tmp_path / "tb" / "validation" / "events*"))
    tags = {(v.tag, e.step) for f in events for e in tf.compat.v1.train.summary_iterator(f) for v in e.summary.value}
    assert tags == {(tag, step) for tag in ("auc", "logloss") for step in (2, 4, 6)}


def test_a_long_programs_parts_say_their_times_and_that_they_still_run():
    """First-day issue (6): the demo was silent for 4 to 6 minutes at a time and printed no time per
    part; `Parts` names each part, says every heartbeat that it still runs, and its time at the end."""
    import time

    from dare_tf.training.progress import Parts

    lines = []
    parts = Parts(lines.append, heartbeat_s=0.05)
    parts.next("1. data")
    time.sleep(0.18)
    parts.next("2. train")
    parts.end()
    time.sleep(0.12)  # (no heartbeat after the end)
    assert lines[0] == "== 1. data" and lines[-1].startswith("done in ") and lines[-1].endswith(" minutes")
    beats = [line for line in lines if line.startswith("(part 1 still running: ")]
    assert len(beats) >= 2 and "(part 1 took 0 s)" in lines and "== 2. train" in lines and "(part 2 took 0 s)" in lines
    assert lines.index("(part 1 took 0 s)") < lines.index("== 2. train") < lines.index("(part 2 took 0 s)")
    assert not any("still running" in line for line in lines[lines.index("(part 2 took 0 s)"):])
