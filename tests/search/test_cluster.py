"""TWIN-V2: the clustering layer and the cluster search against numpy; padding-only histories."""

import keras
import numpy as np
import pytest

import dare_tf
from dare_tf.layers import BehaviorClustering
from tests.conftest import random_batch


def _clusters_numpy(cats, mask, window):
    """(representative slot -> member slots) per row, windows aligned on the last slot."""
    b, length = cats.shape
    out = []
    for r in range(b):
        groups = {}
        for j in range(length):
            if mask[r, j]:
                w = (length - 1 - j) // window
                groups.setdefault((w, cats[r, j]), []).append(j)
        out.append({max(members): members for members in groups.values()})
    return out


def test_clustering_sizes_means_and_log_size_attention(rng):
    b, length, window = 4, 11, 4
    cats = rng.integers(1, 4, (b, length))
    mask = rng.random((b, length)) < 0.85
    k = rng.normal(size=(b, length, 6)).astype("float32")
    v = rng.normal(size=(b, length, 5)).astype("float32")
    keys, values, sizes, valid = (keras.ops.convert_to_numpy(t)
                                  for t in BehaviorClustering(window)(k, v, cats, mask))
    clusters = _clusters_numpy(cats, mask, window)
    for r in range(b):
        assert set(np.flatnonzero(valid[r])) == set(clusters[r])
        for rep, members in clusters[r].items():
            assert sizes[r, rep] == len(members) and len(members) <= window
            np.testing.assert_allclose(keys[r, rep], k[r, members].mean(0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(values[r, rep], v[r, members].mean(0), rtol=1e-5, atol=1e-6)
        assert (sizes[r][~valid[r]] == 0).all()

    # TWIN-V2: the model attends over the top-K clusters with log(size) added to the scores.
    model = dare_tf.build_model("twin_v2", 40, 4, max_len=length, top_k=3, cluster_window=window, seed=0,
                                initializer="keras")
    for table in model.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    x = random_batch(rng, b, length, 40, 4, lengths=[length, 7, 3, 11])
    out = model.forward(x)
    emb = model.embeddings(x).roles
    q, hk = (keras.ops.convert_to_numpy(emb[n]) for n in ("target_attention", "history_attention"))
    pos = model.model_config.attention_pos_dim
    for r, groups in enumerate(_clusters_numpy(x["hist_categories"], x["hist_items"] > 0, window)):
        scores = {}
        for rep, members in groups.items():
            key = hk[r, members].mean(0)
            scores[rep] = (q[r, :-pos] @ key[:-pos]) / np.sqrt(q.shape[1] - pos) \
                + (q[r, -pos:] @ key[-pos:]) / np.sqrt(pos) + np.log(len(members))
        top = sorted(scores, key=lambda j: -scores[j])[:3]
        got = keras.ops.convert_to_numpy(out["positions"])[r][: len(top)]
        np.testing.assert_array_equal(got, top)
        s = np.array([scores[j] for j in top])
        np.testing.assert_allclose(keras.ops.convert_to_numpy(out["attention_weights"])[r][: len(top)],
                                   np.exp(s - s.max()) / np.exp(s - s.max()).sum(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("preset", ["eta", "sdim", "twin_v2"])
def test_all_padding_histories_give_finite_outputs(rng, preset):
    model = dare_tf.build_model(preset, 40, 5, max_len=10, top_k=3, seed=0)
    x = random_batch(rng, 3, 10, 40, 5, lengths=[0, 0, 4])
    out = model.explain(x)
    assert np.isfinite(keras.ops.convert_to_numpy(out["probability"])).all()
    weights = keras.ops.convert_to_numpy(out["attention_weights"])
    assert np.isfinite(weights).all() and (weights[:2] == 0).all()
