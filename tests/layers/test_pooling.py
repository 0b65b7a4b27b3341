import numpy as np

from dare_tf.layers import TargetAttentionPooling

from tests.helpers import tensorflow_only


def numpy_pool(target, values, scores, mask, positions, target_aware):
    out, weights = [], []
    for b in range(values.shape[0]):
        s = scores[b][mask[b]]
        w = np.zeros(scores.shape[1])
        if s.size:
            e = np.exp(s - s.max())
            w[mask[b]] = e / e.sum()
        vals = values[b] if positions is None else values[b][positions[b]]
        h = (w[:, None] * vals).sum(0)
        out.append(np.concatenate([h, target[b] * h]) if target_aware else h)
        weights.append(w)
    return np.array(out), np.array(weights)


def test_pooling_matches_numpy_with_gather_and_padding(rng):
    b, length, k, d = 5, 9, 4, 6
    target = rng.normal(size=(b, d)).astype("float32")
    values = rng.normal(size=(b, length, d)).astype("float32")
    scores = rng.normal(size=(b, k)).astype("float32")
    positions = rng.integers(0, length, (b, k))
    mask = rng.random((b, k)) > 0.3
    mask[0] = False  # an all-padding row pools to zeros
    for target_aware in (True, False):
        out, w = TargetAttentionPooling(target_aware)(
            target, values, scores, mask, positions=positions, return_attention_weights=True)
        ref, ref_w = numpy_pool(target, values, scores, mask, positions, target_aware)
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(w), ref_w, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(out)[0] == 0)


@tensorflow_only
def test_pooling_without_positions_and_finite_gradients(rng):
    import tensorflow as tf  # (here: on JAX, tests/test_backends.py, the module loads no TensorFlow)

    target = tf.constant(rng.normal(size=(2, 3)), tf.float32)
    values = tf.Variable(rng.normal(size=(2, 4, 3)), dtype=tf.float32)
    scores = tf.Variable(rng.normal(size=(2, 4)), dtype=tf.float32)
    mask = np.array([[False] * 4, [True, False, True, True]])
    with tf.GradientTape() as tape:
        out = TargetAttentionPooling()(target, values, scores, mask)
        loss = tf.reduce_sum(out)
    ref, _ = numpy_pool(target.numpy(), values.numpy(), scores.numpy(), mask, None, True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    for g in tape.gradient(loss, [values, scores]):
        assert np.all(np.isfinite(g.numpy()))
