"""ETA's SimHash search against a brute-force numpy ranking."""

import keras
import numpy as np

from dare_tf.search import SimHashTopKSearch


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
    search = SimHashTopKSearch(top_k=4, position_dim=pos, num_bits=5, seed=7)
    found = search(q, k, None, mask)
    positions, scores, valid = (keras.ops.convert_to_numpy(found[n]) for n in ("positions", "scores", "valid"))
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
    again = search(q, k, None, mask, history_signatures=search.signatures(k))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again["positions"]), positions)
