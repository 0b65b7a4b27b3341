"""TrainConfig: sections, flat names, identity."""

import os
import types

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
    # a recorded run's config back (run_config.json's train_config), the runtime given anew
    assert TrainConfig.from_identity(identity, verbose=0) == config
    assert TrainConfig.from_identity(identity).runtime == RuntimeConfig()
    with pytest.raises(TypeError, match="^TrainConfig.create: unknown field 'batchsize'$"):
        TrainConfig.create(batchsize=1)
    with pytest.raises(ValueError, match=r"^optimizer='sgd': must be one of \('adam', 'lazy_adam'\)$"):
        TrainConfig.create(optimizer="sgd")
    with pytest.raises(ValueError, match="^batch_size=0: must be >= 1$"):
        TrainConfig.create(batch_size=0)


def test_a_run_configuration_the_dataset_cannot_hold_is_refused_with_the_flag(taobao):
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training.config import effective_model_config

    spec, one_device = DatasetSpec.load(taobao), types.SimpleNamespace(num_replicas_in_sync=1)
    with pytest.raises(ValueError, match=r"^learning_rate=-1: must be a finite number > 0$"):
        TrainConfig.create(learning_rate=-1)
    with pytest.raises(ValueError, match="^top_k=500 is larger than the history length max_len=200 of the dataset$"):
        effective_model_config(TrainConfig.create(model_overrides=dict(top_k=500)), spec, one_device)
    with pytest.raises(ValueError, match="^ModelConfig.max_len: must be >= 1, got 0$"):
        TrainConfig.create(model_overrides=dict(max_len=0))  # (at configuration time, before any dataset)
    # Issue 45 (10): a step that cannot fit (an internal reshape error, or the OOM killer, at 1,048,576) is
    # refused before anything is built, naming the memory it needs; DARE d=16 holds 8 x 96 + 64 bytes a slot.
    from dare_tf.training.memory import check_step_memory, memory_bytes

    huge = TrainConfig.create(model_overrides=dict(max_len=2**20), batch_size=256).model
    assert memory_bytes() < 208 * 2**30  # (this machine's: the effective config below is refused)
    with pytest.raises(ValueError, match=r"^max_len=1048576 at batch_size=256: one training step holds about 208.0 GiB "
                                         r"for its histories \(256 x 1,048,576 slots of 832 bytes\), more than this "
                                         r"machine's memory, 8.0 GiB; lower --max_len or --batch_size$"):
        check_step_memory(huge, 256, available=8 * 2**30)
    with pytest.raises(ValueError, match=r"^max_len=1048576 at batch_size=256: one training step holds about 208.0 "):
        effective_model_config(TrainConfig.create(model_overrides=dict(max_len=2**20), batch_size=256), spec,
                               one_device)
    check_step_memory(TrainConfig.create(model_overrides=dict(max_len=200), batch_size=256).model, 256)
    with pytest.raises(FileNotFoundError, match="spec.json not found"):
        DatasetSpec.load(taobao + "/nowhere")


def test_cascade_section_checks_its_flags_and_old_runs_keep_their_identity(tmp_path):
    from dare_tf.training.config import CascadeConfig, identity_check

    config = TrainConfig.create(negatives="uniform:1, retrieval:4", retrieval_run="runs/r", batch_size=60,
                                loss="softmax", retrieval_candidates=50)
    assert config.cascade == CascadeConfig("uniform:1,retrieval:4", "runs/r", 50, "softmax", "auto")
    assert config.cascade.group == 6 and config.cascade.selection == "ndcg@10"
    assert config.identity()["cascade"]["retrieval_run"] == os.path.abspath("runs/r")
    assert TrainConfig.create().cascade.selection == "auc" and TrainConfig.create().cascade.group == 1
    for fields, message in [
        (dict(loss="softmax"), "loss='softmax': softmax ranks each click against its drawn negatives: set "
                               "--negatives too"),
        (dict(negatives="retrieval:2"), "negatives='retrieval:2': the retrieval source needs --retrieval_run"),
        (dict(select_by="ndcg@10"), "select_by='ndcg@10': a cascade metric needs --retrieval_run"),
        (dict(retrieval_candidates=1), "retrieval_candidates=1: must be >= 2"),
        (dict(negatives="popularity:2", loss="softmax", batch_size=100),
         "batch_size=100: --loss=softmax needs a multiple of the group size 3 (a click and its 2 negatives)"),
    ]:
        with pytest.raises(ValueError) as e:
            TrainConfig.create(**fields)
        assert str(e.value) == message
    # a run recorded before the cascade section existed is the same run at its defaults
    defaults = identity_check()["defaults"]
    assert defaults["train_config.cascade.negatives"] == "" and defaults["train_config.cascade.loss"] == "pointwise"


def test_the_config_holds_a_typed_model_config_the_dataset_completes(taobao):
    from dare_tf.model.config import ModelConfig
    from dare_tf.model.presets import make_config
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training.config import effective_model_config

    config = TrainConfig.create(preset="twin", model_overrides=dict(top_k=7), reference_mode=True)
    assert isinstance(config.model, ModelConfig)
    assert (config.model.coupling, config.model.top_k, config.model.initializer) == ("shared", 7, "reference")
    with pytest.raises(ValueError, match=r"^ModelConfig: unknown field\(s\) \['topk'\]"):
        TrainConfig.create(model_overrides=dict(topk=7))
    spec, two = DatasetSpec.load(taobao), types.SimpleNamespace(num_replicas_in_sync=2)
    effective = effective_model_config(config, spec, two)
    assert effective == make_config("twin", spec.num_items, spec.num_categories, top_k=7, initializer="reference",
                                    max_len=spec.max_len, synchronized_batch_norm=True)
    long = TrainConfig.create(model_overrides=dict(max_len=2500)).model
    assert (long.max_len, long.num_positions) == (2500, 2501)  # position ids run up to L
