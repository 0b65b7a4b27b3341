"""The trainer's callbacks: a non-finite loss stops with its step."""

import pytest

from dare_tf.training import NonFiniteLossError, TrainConfig, train


def test_nan_loss_stops_with_the_step(taobao, tmp_path):
    config = TrainConfig.create(preset="twin", batch_size=256, eval_batch_size=256, epochs=1, learning_rate=1e30,
                         max_steps=15, eval_every=100, model_overrides=dict(initializer="keras"), jit_compile=False,
                         verbose=0)
    with pytest.raises(NonFiniteLossError, match=r"training loss became (nan|inf) at step \d+ \(epoch 0, seed 0 of twin\)"):
        train(taobao, str(tmp_path / "nan"), config)
