import keras
import numpy as np
import pytest
import tensorflow as tf

import dare_tf
from dare_tf import build_model
from dare_tf.layers import BehaviorEmbedding, TargetAttentionPooling
from dare_tf.search import SoftTopKSearch

from tests.conftest import planted_presence_task, random_batch

NUM_ITEMS, NUM_CATS, LENGTH = 60, 7, 12


def exact_auc(y, p):
    pos, neg = p[y == 1], p[y == 0]
    return ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg))


def expected_param_count(cfg):
    """The parameter count implied by reference.md for a config, with each of its
    fields' tables (`ModelConfig.fields`) beside the item and category tables."""
    widths = cfg.field_widths()  # field -> (attention, representation)

    def tables(dim, pos_dim, side):
        n = cfg.num_items * dim + cfg.num_categories * dim
        n += sum(f.vocabulary * widths[f.name][side] for f in cfg.fields)
        return n + (cfg.num_positions * pos_dim if cfg.use_position else 0)

    d, dp = cfg.embedding_dim, cfg.position_dim
    da, dpa = cfg.attention_dim, cfg.attention_pos_dim
    emb = {
        "shared": tables(d, dp, 1),
        "decoupled": tables(d, dp, 1) + tables(da, dpa, 0),
        "four": 2 * (tables(d, dp, 1) + tables(da, dpa, 0)),
        "projection": tables(d, dp, 1) + 4 * (2 * d * d + sum(r * r for _, r in widths.values())
                                              + (dp * dp if cfg.use_position else 0)),
    }[cfg.coupling]
    width = 2 * d + sum(r for _, r in widths.values()) + (dp if cfg.use_position else 0)
    da_fields = 2 * da + sum(a for a, _ in widths.values())  # the attention vectors' semantic width
    features = width * (3 if cfg.target_aware else 2)

    def mlp(fan_in, units):
        n = 4 * fan_in  # BatchNorm gamma, beta, moving mean, moving variance
        for u in units:
            n += fan_in * u + u + 1  # dense + one PReLU slope
            fan_in = u
        return n + fan_in * 2 + 2

    total = emb + mlp(features, cfg.mlp_units)
    if cfg.use_aux_loss:
        total += mlp(features, cfg.aux_mlp_units)
    if cfg.scorer == "din":
        total += 4 * width * cfg.din_units + cfg.din_units + 1 + cfg.din_units + 1
    # The fixed (non-trainable) SimHash projections of ETA and SDIM, over the semantic width.
    if cfg.search == "simhash":
        total += da_fields * cfg.hash_bits
    if cfg.search == "sdim":
        total += da_fields * cfg.num_hashes * cfg.hash_bits
    return total


@pytest.mark.parametrize("preset", sorted(dare_tf.PRESETS))
def test_parameter_count_matches_reference_formula(preset):
    model = build_model(preset, 1000, 50, max_len=200)
    assert model.count_params() == expected_param_count(model.model_config)


def test_parameter_count_paper_scale_dare():
    # Taobao vocabulary, d=16: the item tables dominate.
    model = build_model("dare", 4_068_791, 9_408, embedding_dim=16)
    assert model.count_params() == expected_param_count(model.model_config)
    assert model.count_params() > 2 * 4_068_791 * 16


def _tables(model):
    return {f"{s}/{f}": v for s, fields in model.embedding.tables.items() for f, v in fields.items()}


def _route_gradients(model, x):
    """Gradients of the search scores and of the pooled vectors (scores held fixed)."""
    emb_layer, tables = model.embedding, _tables(model)
    with tf.GradientTape(persistent=True) as tape:
        emb = emb_layer(x["target_item"], x["target_category"], x["hist_items"], x["hist_categories"])
        mask = x["hist_items"] > 0
        found = model.search(emb["target_attention"], emb["history_attention"], None, mask)
        positions, scores, valid = found["positions"], found["scores"], found["valid"]
        pooled = model.pooling(emb["target_representation"], emb["history_representation"],
                               tf.stop_gradient(scores), valid, positions=positions)
        score_sum = tf.reduce_sum(tf.where(valid, scores, 0.0) * tf.range(1.0, scores.shape[1] + 1.0))
        pooled_sum = tf.reduce_sum(pooled * tf.range(1.0, pooled.shape[1] + 1.0))
    def norm(g):
        return 0.0 if g is None else float(tf.norm(tf.convert_to_tensor(g)))
    return ({k: norm(tape.gradient(score_sum, v)) for k, v in tables.items()},
            {k: norm(tape.gradient(pooled_sum, v)) for k, v in tables.items()})


def test_dare_routes_gradients_to_separate_tables(rng):
    x = random_batch(rng, 8, LENGTH, NUM_ITEMS, NUM_CATS, lengths=[LENGTH] * 8)
    model = build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, initializer="keras", seed=0)
    via_scores, via_pooled = _route_gradients(model, x)
    for name in via_scores:
        if name.startswith("attention/"):
            assert via_scores[name] > 0 and via_pooled[name] == 0, name
        else:
            assert via_scores[name] == 0 and via_pooled[name] > 0, name
    # The full training loss reaches both sets.
    with tf.GradientTape() as tape:
        loss = model.loss_terms(np.ones(8), model.forward(x, training=True))["total"]
    grads = tape.gradient(loss, list(_tables(model).values()))
    assert all(float(tf.norm(tf.convert_to_tensor(g))) > 0 for g in grads)


def test_twin_single_table_receives_both_gradients(rng):
    x = random_batch(rng, 8, LENGTH, NUM_ITEMS, NUM_CATS, lengths=[LENGTH] * 8)
    model = build_model("twin", NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, initializer="keras", seed=0)
    via_scores, via_pooled = _route_gradients(model, x)
    assert set(via_scores) == {"shared/item", "shared/category", "shared/position"}
    for name in via_scores:
        assert via_scores[name] > 0 and via_pooled[name] > 0, name


@pytest.mark.slow
def test_dare_small_attention_dim_trains_end_to_end(rng):
    x, y = planted_presence_task(rng, 6000, 20)
    xt, yt = planted_presence_task(np.random.default_rng(7), 1000, 20)
    model = build_model("dare", 200, 21, max_len=20, top_k=5, embedding_dim=32,
                        attention_embedding_dim=8, attention_position_dim=8, seed=0)
    emb = model.embedding(*(xt[k][:2] for k in dare_tf.INPUT_KEYS))
    assert emb["history_attention"].shape[-1] == 2 * 8 + 8
    assert emb["history_representation"].shape[-1] == 2 * 32 + 16
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    history = model.fit(x, y, batch_size=256, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    auc = exact_auc(yt, model.predict(xt, batch_size=500, verbose=0))
    assert auc > 0.75, auc


@pytest.mark.parametrize("preset", sorted(dare_tf.PRESETS))
def test_xla_and_bfloat16_match_default_path(rng, preset):
    x = random_batch(rng, 16, LENGTH, NUM_ITEMS, NUM_CATS)
    model = build_model(preset, NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, initializer="keras", seed=2)
    for table in model.embedding.weights:  # spread the embeddings so outputs differ per sample
        table.assign(rng.normal(0, 0.5, table.shape))
    expected = np.asarray(model(x))
    assert expected.std() > 1e-3  # outputs vary across samples, so agreement is meaningful
    jit = tf.function(lambda inputs: model(inputs), jit_compile=True)
    np.testing.assert_allclose(np.asarray(jit(x)), expected, atol=1e-5)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half = build_model(preset, NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, initializer="keras")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    half.set_weights(model.get_weights())
    out = half.explain(x)
    assert out["probability"].dtype == tf.float32 and out["attention_weights"].dtype == tf.float32
    assert half.embedding.compute_dtype == "bfloat16"
    # bfloat16 keeps 8 mantissa bits: agreement within 0.02 in probability.
    np.testing.assert_allclose(np.asarray(out["probability"]), expected, atol=0.02)


@pytest.mark.parametrize("preset", sorted(dare_tf.PRESETS))
def test_rank_equals_the_per_example_path(rng, preset):
    """User-major ranking (N candidates per user, each history looked up once) gives
    `explain`'s outputs on the U * N (candidate, history) pairs; empty and short
    histories and the auxiliary head's variants included."""
    users, n = 4, 5
    x = random_batch(rng, users, LENGTH, NUM_ITEMS, NUM_CATS, lengths=[LENGTH, 7, 0, 2])
    model = build_model(preset, NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, initializer="keras", seed=2)
    for table in model.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    candidates = {"candidate_items": rng.integers(1, NUM_ITEMS, (users, n)),
                  "candidate_categories": rng.integers(1, NUM_CATS, (users, n)),
                  "hist_items": x["hist_items"], "hist_categories": x["hist_categories"]}
    got = model.rank_forward(candidates)
    want = model.explain({"target_item": candidates["candidate_items"].reshape(-1),
                          "target_category": candidates["candidate_categories"].reshape(-1),
                          "hist_items": np.repeat(x["hist_items"], n, 0),
                          "hist_categories": np.repeat(x["hist_categories"], n, 0)})
    assert np.asarray(want["probability"]).std() > 1e-3
    np.testing.assert_allclose(np.asarray(model.rank(candidates)), np.asarray(want["probability"]).reshape(users, n),
                               atol=1e-5)
    for key in want:
        value = np.asarray(got[key])
        assert value.shape[:2] == (users, n), key
        np.testing.assert_allclose(value.reshape(np.asarray(want[key]).shape), np.asarray(want[key]), atol=1e-5,
                                   err_msg=key)
    with pytest.raises(KeyError, match=r"^\"DareModel.rank expects a dict with keys \('hist_items'"):
        model.rank({"hist_items": x["hist_items"]})


def _functional_model(length, num_items, num_categories):
    inputs = {k: keras.Input(shape=(length,) if k.startswith("hist") else (), dtype="int32", name=k)
              for k in dare_tf.INPUT_KEYS}
    embedding = BehaviorEmbedding(num_items, num_categories, embedding_dim=8, position_dim=4,
                                  attention_embedding_dim=8, num_positions=length + 1, coupling="decoupled")
    emb = embedding(inputs["target_item"], inputs["target_category"], inputs["hist_items"], inputs["hist_categories"])
    mask = keras.ops.greater(inputs["hist_items"], 0)
    assert embedding.attention_position_width == 4  # (the docs' snippet reads it)
    found = SoftTopKSearch(top_k=4, position_dim=embedding.attention_position_width)(
        emb["target_attention"], emb["history_attention"], emb["history_representation"], mask)
    pooled = TargetAttentionPooling()(emb["target_representation"], found["values"], found["scores"],
                                      found["valid"])
    h = keras.layers.Concatenate()([emb["target_representation"], pooled])
    h = keras.layers.Dense(32, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h)[:, 0])


@pytest.mark.parametrize("preset", ["dare", "twin", "sdim", "din"])
def test_public_embeddings_and_search_stage_are_the_forward_pass(rng, preset):
    """`embeddings` and `search_stage` are the lookups and stage 1 of `forward`: the
    same kept slots, each kept slot's key and value the history's at that slot,
    numpy-checked; SDIM's result pools itself."""
    x = random_batch(rng, 4, LENGTH, NUM_ITEMS, NUM_CATS, lengths=[LENGTH, 7, 1, 3])
    model = build_model(preset, NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, initializer="keras", seed=3)
    for table in model.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    embedded = model.embeddings(x)
    assert [keras.ops.convert_to_numpy(i).tolist() for i in embedded.ids.lookup_args()] == [
        x[k].tolist() for k in ("target_item", "target_category", "hist_items", "hist_categories")]
    assert embedded.ids.target_fields == embedded.ids.history_fields == {}  # no fields beside item and category
    assert sorted(embedded.roles) == ["history_attention", "history_representation", "target_attention",
                                      "target_representation"]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(embedded.mask), x["hist_items"] > 0)
    found = model.search_stage(embedded)
    positions = keras.ops.convert_to_numpy(found.positions)
    np.testing.assert_array_equal(positions, keras.ops.convert_to_numpy(model.explain(x)["positions"]))
    assert found.pools_itself == (preset == "sdim")
    if not found.pools_itself:
        values = keras.ops.convert_to_numpy(embedded.roles["history_representation"])
        kept = np.take_along_axis(values, positions[..., None], axis=1)
        valid = keras.ops.convert_to_numpy(found.valid)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(found.values)[valid], kept[valid], rtol=1e-6)
    attention_only = model.embeddings(x, roles=("target_attention", "history_attention"))
    assert sorted(attention_only.roles) == ["history_attention", "target_attention"]


def test_user_functional_model_learns_planted_task(rng, tmp_path):
    x, y = planted_presence_task(rng, 8000, 20)
    xt, yt = planted_presence_task(np.random.default_rng(99), 2000, 20)
    assert 0.3 < y.mean() < 0.7
    model = _functional_model(20, 200, 21)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    model.fit(x, y, batch_size=128, epochs=6, verbose=0)
    p = model.predict(xt, batch_size=500, verbose=0)
    auc = exact_auc(yt, p)
    assert auc > 0.9, auc
    path = str(tmp_path / "functional.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path).predict(xt, verbose=0), p, atol=1e-6)


def test_a_saved_model_loads_in_a_fresh_process_after_dare_tf_load(rng, tmp_path):
    """`import dare_tf` alone registers nothing (it imports nothing); `dare_tf.load()`
    registers the model, every search variant and the optimizers, so a saved SDIM
    model with its FusedAdam state loads and predicts the same."""
    import subprocess
    import sys

    from tests.conftest import ENV, REPO

    model = build_model("sdim", NUM_ITEMS, NUM_CATS, max_len=LENGTH, seed=1)
    model.compile(optimizer=dare_tf.optimizers.FusedAdam(0.01))
    x = random_batch(rng, 4, LENGTH, NUM_ITEMS, NUM_CATS)
    model.fit(x, np.array([1.0, 0, 1, 0]), verbose=0)
    path = str(tmp_path / "sdim.keras")
    model.save(path)
    np.save(tmp_path / "x.npy", x, allow_pickle=True)
    code = ("import sys, numpy as np, dare_tf, keras\n"
            "assert 'dare_tf.model.dare_model' not in sys.modules\n"
            "dare_tf.load()\n"
            "m = keras.saving.load_model(sys.argv[1])\n"
            "x = np.load(sys.argv[2], allow_pickle=True).item()\n"
            "p = m.predict(x, verbose=0).ravel().tolist()\n"
            "print(type(m).__name__, type(m.optimizer).__name__, *p)")
    done = subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "x.npy")], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    name, optimizer, *values = done.stdout.strip().splitlines()[-1].split()
    assert (name, optimizer) == ("DareModel", "FusedAdam")
    np.testing.assert_allclose([float(v) for v in values], model.predict(x, verbose=0).ravel(), atol=1e-6)


def test_the_din_scorer_is_refused_for_a_top_k_search():
    with pytest.raises(ValueError, match=r"^scorer='din': the DIN activation unit scores a whole history; "
                       r"search='soft' ranks by its own scores \(use search='none'\)$"):
        build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, coupling="shared", attention_embedding_dim=16,
                    attention_position_dim=None, scorer="din")


def test_input_errors(rng):
    model = build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4)
    x = random_batch(rng, 2, LENGTH, NUM_ITEMS, NUM_CATS)
    with pytest.raises(KeyError, match="lack \\['hist_categories'\\]"):
        model({k: v for k, v in x.items() if k != "hist_categories"})
    with pytest.raises(ValueError, match="built for max_len=12"):
        model(random_batch(rng, 2, LENGTH + 1, NUM_ITEMS, NUM_CATS))
    with pytest.raises(ValueError, match="unknown preset 'sim'"):
        build_model("sim", 10, 3)
    with pytest.raises(ValueError, match="ModelConfig.attention_embedding_dim"):
        build_model("twin", 10, 3, attention_embedding_dim=4)


def test_compiled_train_step_equals_keras_default_step(rng):
    """The one-XLA-function step (dense gradients) trains exactly like Keras's own step."""
    from dare_tf.optimizers import FusedAdam

    x = random_batch(rng, 96, LENGTH, NUM_ITEMS, NUM_CATS)
    y = rng.integers(0, 2, 96).astype("float32")
    models = [build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, seed=0, initializer="keras",
                          jit_compile_dense=jit, sparse_embedding_gradients=False) for jit in (True, False)]
    histories = []
    for model in models:
        model.compile(optimizer=FusedAdam(0.01), metrics=[keras.metrics.AUC(name="auc")])
        histories.append(model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history)
    from dare_tf.model.execution import whole_gradient_in_xla

    assert whole_gradient_in_xla(models[0]) and not whole_gradient_in_xla(models[1])
    np.testing.assert_allclose(histories[0]["loss"], histories[1]["loss"], rtol=1e-4)
    np.testing.assert_allclose(histories[0]["auc"], histories[1]["auc"], atol=1e-3)
    moved = False
    for a, b, start in zip(models[0].get_weights(), models[1].get_weights(),
                           build_model("dare", NUM_ITEMS, NUM_CATS, max_len=LENGTH, top_k=4, seed=0,
                                       initializer="keras").get_weights()):
        # XLA orders float operations differently (more so without its optimisation
        # passes, as the tests run it); Adam divides by |gradient|, so for near-zero
        # gradients that moves a few weights by a fraction of their 0.01 step (measured:
        # 5 of 960 by up to 1.5e-3, 8 of 28,800 by up to 4.5e-3). A wrong gradient moves
        # most weights.
        differ = np.abs(a - b)
        assert (differ > 1e-3).mean() < 0.02 and differ.max() < 1e-2, (differ.max(), (differ > 1e-3).mean())
        moved = moved or np.abs(a - start).max() > 1e-3
    assert moved


@pytest.mark.parametrize("search", ["soft", "hard"])
def test_retrieved_only_lookups_equal_the_full_history_path(rng, search):
    """Issue 15: DARE looking up representation (and, for gradients, attention)
    rows for the K retrieved slots only gives the full-history path's outputs
    exactly and its gradients to float rounding."""
    from dare_tf.model.presets import make_config
    from dare_tf.model.dare_model import DareModel

    cfg = make_config("dare", 60, 8, max_len=40, top_k=5, search=search, aux_attention="retrieved",
                      attention_embedding_dim=4)
    x = {"target_item": rng.integers(1, 59, 16).astype("int32"),
         "target_category": rng.integers(1, 7, 16).astype("int32"),
         "hist_items": rng.integers(0, 59, (16, 40)).astype("int32"),
         "hist_categories": rng.integers(1, 7, (16, 40)).astype("int32")}
    x["hist_items"][:4, :37] = 0  # fewer behaviours than K: padded slots are retrieved too
    runs = []
    for sparse in (True, False):  # True: rows read before the search (all L); False: K only
        model = DareModel(cfg, seed=1, sparse_embedding_gradients=sparse)
        model.build()
        assert model.retrieved_representation_only() is (not sparse)
        with tf.GradientTape() as tape:
            out = model.forward(x, training=True)
            loss = tf.reduce_sum(out["probability"]) + tf.reduce_sum(out["aux_probability"])
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
        runs.append((out, grads))
    (full, full_grads), (late, late_grads) = runs
    for k in ("probability", "positions", "attention_weights", "features"):
        np.testing.assert_array_equal(np.asarray(full[k]), np.asarray(late[k]))
    assert max(np.abs(g).max() for g in full_grads) > 0.1
    for a, b in zip(full_grads, late_grads):
        np.testing.assert_allclose(a, b, atol=1e-9)
    assert not make_config("dare", 60, 8).aux_attention == "retrieved"  # the reference keeps all-slot aux
    assert not DareModel(make_config("dare", 60, 8, max_len=40), sparse_embedding_gradients=False
                         ).retrieved_representation_only()
