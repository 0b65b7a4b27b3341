"""DareModel with behaviour fields beside item and category (`ModelConfig.fields`):
the parameter count against the formula extended to fields, every preset's forward
and `rank` with 2 and 4 fields (the fields reach the prediction; `rank` equals the
forward pass on its pairs), a compiled training step, the config's round trip and
its one-line refusals."""

import dataclasses

import keras
import numpy as np
import pytest

import dare_tf
from dare_tf import build_model
from dare_tf.model.config import ModelConfig
from dare_tf.model.presets import PRESETS
from tests.conftest import random_batch
from tests.model.test_dare_model import expected_param_count

NUM_ITEMS, NUM_CATS, LENGTH = 60, 7, 12
BRAND = dict(name="brand", vocabulary=30, embedding_dim=4, attention_embedding_dim=2)
GAP = dict(name="gap", vocabulary=8, embedding_dim=3, history_only=True)


def fields_for(preset, embedding_dim=16):
    """Brand and a history-only time gap; with one set of tables their attention width is their representation's."""
    shared = PRESETS[preset]["coupling"] in ("shared", "projection")
    return [dict(f, attention_embedding_dim=f["embedding_dim"]) if shared else f for f in (BRAND, GAP)]


def with_fields(rng, x, batch, length):
    return {**x, "target_brand": rng.integers(1, 30, batch), "hist_brand": rng.integers(0, 30, (batch, length)),
            "hist_gap": rng.integers(0, 8, (batch, length))}


@pytest.mark.parametrize("preset", sorted(dare_tf.PRESETS))
def test_parameter_count_with_fields_matches_the_formula(preset):
    model = build_model(preset, 1000, 50, max_len=20, fields=fields_for(preset))
    assert model.count_params() == expected_param_count(model.model_config)


@pytest.mark.parametrize("preset", sorted(dare_tf.PRESETS))
def test_every_preset_runs_with_2_and_4_fields_and_rank_is_its_forward_pass(rng, preset):
    x = random_batch(rng, 4, LENGTH, NUM_ITEMS, NUM_CATS, lengths=[LENGTH, 7, 1, 3])
    x4 = with_fields(rng, x, 4, LENGTH)
    two = build_model(preset, NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, seed=3)
    four = build_model(preset, NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, seed=3, fields=fields_for(preset))
    for model, inputs in ((two, x), (four, x4)):
        out = model.forward(inputs)
        assert keras.ops.convert_to_numpy(out["probability"]).shape == (4,)
        assert out["positions"].shape[0] == 4
    for table in four.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    features = keras.ops.convert_to_numpy(four.forward(x4)["features"])
    # The fields reach the prediction head: other brands (of the history or the target) and other
    # gaps give it other inputs.
    for key, high in (("hist_brand", 30), ("target_brand", 30), ("hist_gap", 8)):
        other = dict(x4, **{key: (x4[key] + 1) % high})
        assert np.abs(keras.ops.convert_to_numpy(four.forward(other)["features"]) - features).max() > 1e-3, key
    # rank: two users' histories against three candidates each = forward on the six pairs.
    users, n = 2, 3
    candidates = {"candidate_items": rng.integers(1, NUM_ITEMS, (users, n)),
                  "candidate_categories": rng.integers(1, NUM_CATS, (users, n)),
                  "candidate_brand": rng.integers(1, 30, (users, n))}
    history = {k: x4[k][:users] for k in ("hist_items", "hist_categories", "hist_brand", "hist_gap")}
    ranked = keras.ops.convert_to_numpy(four.rank({**history, **candidates}))
    pairs = {"target_item": candidates["candidate_items"].reshape(-1),
             "target_category": candidates["candidate_categories"].reshape(-1),
             "target_brand": candidates["candidate_brand"].reshape(-1),
             **{k: np.repeat(v, n, axis=0) for k, v in history.items()}}
    np.testing.assert_allclose(ranked.reshape(-1), keras.ops.convert_to_numpy(four(pairs)), rtol=1e-4, atol=1e-6)


def test_a_field_the_label_depends_on_is_learned_compiled(rng):
    """The click is the target brand's parity: DARE with the brand field learns it
    (test AUC near 1, training compiled with sparse table gradients), the same model
    without it cannot (near 0.5); the config survives the model's JSON."""
    from tests.model.test_dare_model import exact_auc

    def log(n):
        x = with_fields(rng, random_batch(rng, n, LENGTH, NUM_ITEMS, NUM_CATS), n, LENGTH)
        return x, (x["target_brand"] % 2).astype("float32")

    (train, y), (test, y_test) = log(512), log(512)
    auc = {}
    for fields in ((), fields_for("dare")):  # (the last, with fields, is restored below)
        model = build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, seed=1, fields=fields)
        model.compile(optimizer=keras.optimizers.Adam(0.01))
        model.fit(train, y, epochs=8, batch_size=64, verbose=0)
        auc[len(fields)] = exact_auc(y_test, model.predict(test, batch_size=512, verbose=0))
    assert auc[2] > 0.9 and auc[0] < 0.7, auc
    restored = keras.models.model_from_json(model.to_json())
    assert restored.model_config == model.model_config


def test_the_config_records_fields_and_refuses_bad_ones():
    config = dare_tf.make_config("dare", 100, 10, fields=[BRAND, GAP])
    assert [dataclasses.asdict(f) for f in config.fields] == [dict(history_only=False, **BRAND),
                                                              dict(attention_embedding_dim=None, **GAP)]
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert "fields" not in dare_tf.make_config("dare", 100, 10).to_dict()  # recorded as before fields existed
    assert config.attention_width == 2 * 16 + 2 + 16 + 16 and config.representation_width == 2 * 16 + 4 + 3 + 16
    for overrides, message in [
        (dict(fields=[BRAND, BRAND]), "ModelConfig.fields: a field is named twice: ['brand', 'brand']"),
        (dict(fields=[dict(name="item", vocabulary=5)]), "ModelConfig.fields: BehaviorField.name: 'item' must be "
                                                         "an identifier other than item, category, position"),
        (dict(fields=[dict(name="brand")]), "ModelConfig.fields: BehaviorField.__init__() missing 1 required "
                                            "positional argument: 'vocabulary'"),
    ]:
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(
                "[", r"\[").replace("]", r"\]")):
            dare_tf.make_config("dare", 100, 10, **overrides)
    with pytest.raises(ValueError, match=r"^ModelConfig.fields: coupling='shared' uses one set of tables, so field "
                                         r"'brand''s attention width 2 must equal its representation width 4$"):
        dare_tf.make_config("twin", 100, 10, fields=[BRAND])
    model = build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, fields=[BRAND, GAP])
    x = random_batch(np.random.default_rng(0), 2, LENGTH, NUM_ITEMS, NUM_CATS)
    with pytest.raises(KeyError, match=r"DareModel inputs lack \['hist_brand', 'hist_gap', 'target_brand'\]: the "
                                       r"model's fields \(brand, gap\) each need their ids"):
        model(x)

