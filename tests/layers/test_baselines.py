"""ETA's SimHash search, SDIM's hash sampling and TWIN-V2's clustering against
brute-force numpy implementations; padding and empty histories."""

import keras
import numpy as np
import pytest

import dare_tf
from dare_tf.layers import BehaviorClustering, HashSamplingPooling, TopKBehaviorSearch
from tests.conftest import random_batch


def _bits(x, projection, position_dim):
    return (x[..., : x.shape[-1] - position_dim] @ projection) > 0


def test_simhash_search_ranks_by_hamming_distance_then_recency(rng):
    b, length, width, pos = 6, 12, 10, 2
    q = rng.normal(size=(b, width)).astype("float32")
    k = rng.normal(size=(b, length, width)).astype("float32")
    k[:, 3] = q  # one exact match per row: distance 0
    mask = rng.random((b, length)) < 0.8
    mask[0, :] = False
    mask[0, -2:] = True  # row 0: two real slots only (K = 4 > 2)
    search = TopKBehaviorSearch(top_k=4, mode="simhash", position_dim=pos, num_bits=5, seed=7)
    positions, scores, valid = (np.asarray(keras.ops.convert_to_numpy(t)) for t in search(q, k, mask))
    projection = keras.ops.convert_to_numpy(search.projection)
    qb, kb = _bits(q, projection, pos), _bits(k, projection, pos)
    packed = (kb.reshape(b, length, 1, 5) * 2 ** np.arange(5)).sum(-1)  # 5 bits: one 16-bit word
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(search.signatures(k)), packed)
    for r in range(b):
        real = np.flatnonzero(mask[r])
        distance = (kb[r, real] != qb[r]).sum(axis=1)
        order = sorted(real, key=lambda j: (distance[list(real).index(j)], -j))[:4]
        n = len(order)
        np.testing.assert_array_equal(positions[r, :n], order)
        assert valid[r, :n].all() and not valid[r, n:].any()  # padding is never valid
        expected_scores = (q[r, :-pos] @ k[r, order, :-pos].T) / np.sqrt(width - pos) \
            + (q[r, -pos:] @ k[r, order, -pos:].T) / np.sqrt(pos)
        np.testing.assert_allclose(scores[r, :n], expected_scores, rtol=1e-5, atol=1e-5)
    # Precomputed history signatures give the same result.
    again = search(q, k, mask, history_signatures=search.signatures(k))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again[0]), positions)


def test_hash_sampling_matches_bucket_means(rng):
    b, length, da, dr, pos, m, tau = 5, 9, 8, 6, 2, 4, 2
    q = rng.normal(size=(b, da)).astype("float32")
    k = rng.normal(size=(b, length, da)).astype("float32")
    k[:, :3] = q[:, None, :]  # copies of the target: the same buckets
    v = rng.normal(size=(b, length, dr)).astype("float32")
    mask = rng.random((b, length)) < 0.8
    mask[:, 0] = False  # a padded copy: must not count
    mask[:, 1:3] = True
    layer = HashSamplingPooling(num_hashes=m, hash_bits=tau, position_dim=pos, seed=1)
    interest, weights, matches = (keras.ops.convert_to_numpy(t) for t in layer(q, k, v, mask))
    projection = keras.ops.convert_to_numpy(layer.projection)
    powers = 2 ** np.arange(tau)
    qc = (_bits(q, projection, pos).reshape(b, m, tau) * powers).sum(-1)
    kc = (_bits(k, projection, pos).reshape(b, length, m, tau) * powers).sum(-1)
    expected_matches = (kc == qc[:, None, :]) & mask[..., None]
    np.testing.assert_array_equal(matches, expected_matches)
    assert expected_matches[:, 1:3].all()  # the copies share every bucket
    for r in range(b):
        per_hash = []
        for h in range(m):
            s = v[r][expected_matches[r, :, h]].sum(axis=0)
            per_hash.append(s / np.linalg.norm(s) if np.linalg.norm(s) > 0 else s)
        np.testing.assert_allclose(interest[r], np.mean(per_hash, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, expected_matches.mean(-1))


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
    ids = model._unpack(x)
    emb = model.embedding.combine(model.embedding.lookup(*ids))
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


def test_packed_signatures_count_differing_bits(rng):
    from dare_tf.layers.hashing import hamming_distance, pack_bits

    a = rng.random((3, 37)) < 0.5
    b = rng.random((3, 5, 37)) < 0.5
    got = keras.ops.convert_to_numpy(hamming_distance(pack_bits(a), pack_bits(b)))
    np.testing.assert_array_equal(got, (a[:, None, :] != b).sum(-1))
