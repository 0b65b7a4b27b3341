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


@pytest.mark.own_process  # tf.keras as Keras 2, resolved once per process
def test_factorized_top_k_recall_and_the_index_match_numpy_and_keras3_coexists():
    import tensorflow as tf

    import dare_tf
    from dare_tf.retrieval import TwoTowerModel, brute_force_index

    rng = np.random.default_rng(0)
    items = np.arange(1, 300, dtype=np.int32); cats = (items % 7 + 1).astype(np.int32)
    model = TwoTowerModel(301, 9, 8, 8, (items, cats), ks=(1, 5, 20))
    hist = rng.integers(0, 300, (64, 12)).astype(np.int32); hist[:, :3] = 0
    pos = rng.choice(items, 64).astype(np.int32)
    x = {"hist_items": hist, "hist_categories": np.where(hist > 0, hist % 7 + 1, 0).astype(np.int32),
         "target_item": pos, "target_category": (pos % 7 + 1).astype(np.int32)}
    model.query(x); model.candidate((items, cats))  # build
    for w in model.trainable_variables:  # spread the towers so scores differ
        w.assign(rng.normal(0, 1, w.shape))
    model.compile(optimizer="adagrad")
    metrics = model.evaluate(tf.data.Dataset.from_tensor_slices(x).batch(64), return_dict=True, verbose=0)
    q = model.query(x).numpy(); c = model.candidate((items, cats)).numpy()
    ref = recall_at_k(q, c, items, pos, (1, 5, 20))
    got = {f"recall@{k}": metrics[f"factorized_top_k/top_{k}_categorical_accuracy"] for k in (1, 5, 20)}
    _, ids = brute_force_index(model, (items, cats), 10)({"hist_items": hist, "hist_categories": x["hist_categories"]})
    top = items[np.argsort(-(q @ c.T), axis=1, kind="stable")[:, :10]]
    ranker = dare_tf.build_model("dare", 50, 5, max_len=8, top_k=3); ranker.compile(optimizer="adam")
    loss = float(ranker.evaluate(ranker.dummy_inputs(4), np.array([1.0, 0, 1, 0]), verbose=0))
    import keras

    out = {"got": got, "ref": ref, "same_top": bool((ids.numpy() == top).all()),
           "keras3": keras.__version__.startswith("3"), "loss": loss}
    for k, v in out["ref"].items():
        assert out["got"][k] == pytest.approx(v, abs=1e-6), (k, out)
    assert 0 < out["ref"]["recall@20"] < 1
    assert out["same_top"] and out["keras3"] and out["loss"] > 0


def test_tf_keras_resolved_to_keras3_first_is_refused_with_the_fix():
    env = {k: v for k, v in ENV.items() if k != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run([sys.executable, "-c", "import tensorflow as tf\ntf.keras.layers\nimport dare_tf.retrieval\n"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "TF_USE_LEGACY_KERAS=1" in done.stderr and "already resolved to Keras 3" in done.stderr
