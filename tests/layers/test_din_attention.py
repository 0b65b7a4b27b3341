import numpy as np

from dare_tf.layers import DINAttention


def test_din_attention_matches_numpy(rng):
    q = rng.normal(size=(3, 6)).astype("float32")
    k = rng.normal(size=(3, 5, 6)).astype("float32")
    layer = DINAttention(units=4, initializer="reference", seed=3)
    scores = np.asarray(layer(q, k))
    w1, b1 = (np.asarray(v) for v in layer.hidden.weights)
    alpha = np.asarray(layer.activation.weights[0])
    w2, b2 = (np.asarray(v) for v in layer.out.weights)
    qq = np.broadcast_to(q[:, None], k.shape)
    h = np.concatenate([qq, k, qq - k, qq * k], -1) @ w1 + b1
    h = np.where(h > 0, h, alpha.reshape(()) * h)
    ref = (h @ w2 + b2)[..., 0] / 6.0
    np.testing.assert_allclose(scores, ref, rtol=1e-4, atol=1e-6)
    assert alpha.size == 1  # one PReLU slope, as the reference's nn.PReLU(num_parameters=1)
