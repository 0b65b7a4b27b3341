"""SDIM's hash sampling against brute-force bucket means."""

import keras
import numpy as np

from dare_tf.search import HashSamplingSearch


def _bits(x, projection, position_dim):
    return (x[..., : x.shape[-1] - position_dim] @ projection) > 0


def test_hash_sampling_matches_bucket_means(rng):
    b, length, da, dr, pos, m, tau = 5, 9, 8, 6, 2, 4, 2
    q = rng.normal(size=(b, da)).astype("float32")
    k = rng.normal(size=(b, length, da)).astype("float32")
    k[:, :3] = q[:, None, :]  # copies of the target: the same buckets
    v = rng.normal(size=(b, length, dr)).astype("float32")
    mask = rng.random((b, length)) < 0.8
    mask[:, 0] = False  # a padded copy: must not count
    mask[:, 1:3] = True
    layer = HashSamplingSearch(num_hashes=m, hash_bits=tau, position_dim=pos, seed=1)
    found = layer(q, k, v, mask)
    interest, weights, matches = (keras.ops.convert_to_numpy(t) for t in (
        found["pooled"], found["weights"], found["explain"]["hash_matches"]))
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
