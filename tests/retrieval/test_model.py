"""The two-tower model (tensorflow-recommenders, Keras 2, beside Keras 3)."""

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ENV, REPO



def recall_at_k(q, c, ids, positives, ks):
    """Share of queries whose positive is among the k highest dot products."""
    scores = q @ c.T
    positive = scores[np.arange(len(positives)), np.searchsorted(ids, positives)]
    rank = (scores > positive[:, None]).sum(axis=1)
    return {f"recall@{k}": float((rank < k).mean()) for k in ks}


@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
def test_factorized_top_k_recall_and_the_index_match_numpy_and_keras3_coexists():
    import tensorflow as tf

    import dare_tf
    from dare_tf.retrieval import TwoTowerModel, brute_force_index

    rng = np.random.default_rng(0)
    items = np.arange(1, 300, dtype=np.int32)
    cats = (items % 7 + 1).astype(np.int32)
    model = TwoTowerModel(301, 9, 8, 8, (items, cats), ks=(1, 5, 20))
    hist = rng.integers(0, 300, (64, 12)).astype(np.int32)
    hist[:, :3] = 0
    pos = rng.choice(items, 64).astype(np.int32)
    x = {"hist_items": hist, "hist_categories": np.where(hist > 0, hist % 7 + 1, 0).astype(np.int32),
         "target_item": pos, "target_category": (pos % 7 + 1).astype(np.int32)}
    model.query(x)
    model.candidate((items, cats))  # build
    for w in model.trainable_variables:  # spread the towers so scores differ
        w.assign(rng.normal(0, 1, w.shape))
    model.compile(optimizer="adagrad")
    metrics = model.evaluate(tf.data.Dataset.from_tensor_slices(x).batch(64), return_dict=True, verbose=0)
    q = model.query(x).numpy()
    c = model.candidate((items, cats)).numpy()
    ref = recall_at_k(q, c, items, pos, (1, 5, 20))
    got = {f"recall@{k}": metrics[f"factorized_top_k/top_{k}_categorical_accuracy"] for k in (1, 5, 20)}
    _, ids = brute_force_index(model, (items, cats), 10)({"hist_items": hist, "hist_categories": x["hist_categories"]})
    top = items[np.argsort(-(q @ c.T), axis=1, kind="stable")[:, :10]]
    ranker = dare_tf.build_model("dare", 50, 5, max_len=8, top_k=3)
    ranker.compile(optimizer="adam")
    loss = float(ranker.evaluate(ranker.dummy_inputs(4), np.array([1.0, 0, 1, 0]), verbose=0))
    import keras

    out = {"got": got, "ref": ref, "same_top": bool((ids.numpy() == top).all()),
           "keras3": keras.__version__.startswith("3"), "loss": loss}
    for k, v in out["ref"].items():
        assert out["got"][k] == pytest.approx(v, abs=1e-6), (k, out)
    assert 0 < out["ref"]["recall@20"] < 1
    assert out["same_top"] and out["keras3"] and out["loss"] > 0


def sampled_softmax_loss(q, c, ids, probability=None):
    """Sum over queries of -log softmax over all candidates (positive: query i's
    column i; other columns with query i's positive id removed), logits corrected
    by -log(probability)."""
    logits = q @ c.T - (0 if probability is None else np.log(probability)[None])
    b = len(q)
    hit = (ids[None, :] == ids[:b, None]) & ~np.eye(b, len(ids), dtype=bool)
    logits = np.where(hit, -np.inf, logits)
    top = logits.max(axis=1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    return float(-log_softmax[np.arange(b), np.arange(b)].sum())


@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
def test_training_loss_with_extra_negatives_matches_a_numpy_sampled_softmax():
    """Mixed negatives: the batch's positives and the drawn catalogue items are the
    candidates, each corrected by log(batch * share + uniform_negatives / catalogue); a
    drawn item equal to a query's positive is not its negative; evaluation uses
    the batch alone."""
    import tensorflow as tf

    from dare_tf.retrieval import TwoTowerModel

    rng = np.random.default_rng(1)
    items = np.arange(1, 40, dtype=np.int32)
    cats = (items % 5 + 1).astype(np.int32)
    share = rng.dirichlet(np.ones(len(items)))
    pos = np.array([3, 7, 7, 12, 30, 2], np.int32)
    hist = rng.integers(1, 40, (6, 9)).astype(np.int32)
    x = {"hist_items": hist, "hist_categories": hist % 5 + 1, "target_item": pos, "target_category": pos % 5 + 1,
         "sampling_probability": share[pos - 1].astype(np.float32)}
    slots = np.array([0, 6, 20, 29, 11], np.int32)  # items 1, 7 (a positive of queries 1, 2), 21, 30, 12
    out = {}
    for correction in (True, False):
        model = TwoTowerModel(41, 7, 8, 8, (items, cats), popularity_correction=correction,
                              uniform_negatives=len(slots),
                              click_share=share)
        model.negative_slots = lambda: tf.constant(slots)
        model.query(x)
        model.candidate((items, cats))
        for w in model.trainable_variables:
            w.assign(rng.normal(0, 0.5, w.shape))
        ids = np.concatenate([pos, items[slots]])
        q = model.query(x).numpy()
        c = model.candidate((ids, (ids % 5 + 1).astype(np.int32))).numpy()
        p = 6 * np.concatenate([share[pos - 1], share[slots]]) + len(slots) / len(items)
        out[correction] = (float(model.compute_loss(x, training=True)),
                           sampled_softmax_loss(q, c, ids, p if correction else None),
                           float(model.compute_loss(x, training=False)),
                           sampled_softmax_loss(q, c[:6], pos, x["sampling_probability"] if correction else None))
    for correction, (got, want, got_eval, want_eval) in out.items():
        assert got == pytest.approx(want, rel=1e-5), correction
        assert got_eval == pytest.approx(want_eval, rel=1e-5), correction
    assert out[True][0] != pytest.approx(out[False][0], rel=1e-3)
    with pytest.raises(ValueError, match="uniform_negatives > 0 with popularity_correction needs click_share"):
        TwoTowerModel(41, 7, 8, 8, (items, cats), uniform_negatives=3)


def test_the_keras2_switch_is_explicit_and_refuses_too_late_with_the_fix():
    """Importing dare_tf.retrieval changes nothing; its TFRS model refuses a tf.keras
    that is not Keras 2, and `use_keras2` one already resolved to Keras 3; both name
    the fix. Called before tf.keras resolves (TensorFlow imported or not), it works."""
    env = {k: v for k, v in ENV.items() if k != "TF_USE_LEGACY_KERAS"}
    fix = ("call dare_tf.retrieval.use_keras2() before anything touches tf.keras (`import keras` alone is fine), "
           "or set TF_USE_LEGACY_KERAS=1 in the environment")
    scripts = {
        "import os, dare_tf.retrieval\nassert 'TF_USE_LEGACY_KERAS' not in os.environ\nimport dare_tf.retrieval.model":
            f"RuntimeError: dare_tf.retrieval needs tf.keras to be Keras 2 (tf-keras) for tensorflow-recommenders: "
            f"{fix}",
        "import tensorflow as tf\ntf.keras.layers\nimport dare_tf.retrieval\ndare_tf.retrieval.use_keras2()":
            f"RuntimeError: tf.keras already resolved to Keras 3 (keras._tf_keras.keras) in this process: {fix}",
        "import tensorflow as tf, keras\nimport dare_tf.retrieval\ndare_tf.retrieval.use_keras2()\n"
        "from dare_tf.retrieval.model import TwoTowerModel\nprint(tf.keras.__name__)": None,
    }
    for script, error in scripts.items():
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        if error is None:
            assert done.returncode == 0 and done.stdout.strip().startswith("tf_keras"), done.stderr[-2000:]
        else:
            assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == error, done.stderr[-2000:]
