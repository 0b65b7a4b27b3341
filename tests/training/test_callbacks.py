"""The trainer's callbacks: a non-finite loss stops with its step."""

import pytest

from dare_tf.training import NonFiniteLossError, TrainConfig, train


def test_nan_loss_stops_with_the_step(taobao, tmp_path):
    config = TrainConfig.create(preset="twin", batch_size=256, eval_batch_size=256, epochs=1, learning_rate=1e30,
                         max_steps=15, eval_every=100, model_overrides=dict(initializer="keras"), jit_compile=False,
                         verbose=0)
    with pytest.raises(NonFiniteLossError,
                       match=r"training loss became (nan|inf) at step \d+ \(epoch 0, seed 0 of twin\)"):
        train(taobao, str(tmp_path / "nan"), config)


def test_run_progress_names_the_seed_shows_one_bar_over_the_run_and_validations_beneath():
    import types

    import keras
    import numpy as np

    from dare_tf.training import RunProgress

    lines = []
    validation = types.SimpleNamespace(last=None)

    class Validate(keras.callbacks.Callback):  # what ExactValidation leaves for the others
        def on_epoch_end(self, epoch, logs=None):
            validation.last = {"step": int(self.model.optimizer.iterations.numpy()), "val": {"auc": 0.5 + epoch / 10}}

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((12, 2), np.float32), np.ones((12, 1), np.float32)
    progress = RunProgress("dare on taobao_sample, seed 2 of 3 (seed 1)", 6, validation, lines.append)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Validate(), progress])
    assert lines == ["dare on taobao_sample, seed 2 of 3 (seed 1): steps 1 to 6",
                     "\n  validation at step 3: auc 0.5000", "\n  validation at step 6: auc 0.6000"]
    assert progress.bar.target == 6 and progress.bar._seen_so_far == 6  # one bar over the run's steps
