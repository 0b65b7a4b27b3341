"""TrainConfig: sections, flat names, identity."""

import pytest

from dare_tf.training import TrainConfig


def test_train_config_sections_flat_names_and_identity():
    from dare_tf.training.config import DataConfig, OptimizerConfig, RuntimeConfig, ScheduleConfig

    config = TrainConfig.create(preset="twin", batch_size=64, optimizer="lazy_adam", in_memory_mb=0, verbose=0,
                                seeds=[3, 4])
    assert config.schedule == ScheduleConfig(batch_size=64) and config.optimizer == OptimizerConfig("lazy_adam")
    assert config.data == DataConfig(in_memory_mb=0) and config.runtime == RuntimeConfig(verbose=0)
    assert config.seeds == (3, 4) and TrainConfig.create(**config.flat()) == config
    assert config.replace(learning_rate=0.5).optimizer.learning_rate == 0.5
    identity = config.identity()
    assert "runtime" not in identity and identity["optimizer"] == {"name": "lazy_adam", "learning_rate": 0.01}
    with pytest.raises(TypeError, match="^TrainConfig.create: unknown field 'batchsize'$"):
        TrainConfig.create(batchsize=1)
    with pytest.raises(ValueError, match=r"^optimizer='sgd': must be one of \('adam', 'lazy_adam'\)$"):
        TrainConfig.create(optimizer="sgd")
    with pytest.raises(ValueError, match="^batch_size=0: must be >= 1$"):
        TrainConfig.create(batch_size=0)
