"""BehaviorClustering: TWIN-V2's compression of a history into clusters."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="dare_tf")
class BehaviorClustering(keras.layers.Layer):
    """Groups a history into clusters and represents each by its mean and size.

    A two-level hierarchy, deterministic and inside the model (so a served
    model takes the raw history, and no clustering state needs to be kept or
    versioned): the history is cut into time windows of `window` consecutive
    behaviours (aligned on the most recent one), and within a window the
    behaviours of one category form a cluster. A cluster never spans more
    than `window` behaviours, so the count lies between L / window and L.
    Each cluster sits at the slot of its most recent member, holding the mean
    of its members' attention and representation vectors and its size; the
    other slots are invalid. TWIN-V2 clusters offline by hierarchical k-means
    on item features; this layer clusters on category and time instead, which
    needs no offline job and costs O(L x window) per history.

    Args:
        window: behaviours per time window (the cluster size bound).

    Call arguments:
        keys: history attention embeddings `[B, L, Da]`.
        values: history representation embeddings `[B, L, Dr]`.
        categories: `[B, L]` int category ids.
        mask: `[B, L]` bool, True for real behaviours.

    Returns:
        `(keys, values, sizes, valid)`: per slot, the cluster means `[B, L, Da]`
        and `[B, L, Dr]` and the float32 cluster size `[B, L]` where `valid`
        `[B, L]` (the clusters' most recent members); zeros elsewhere.

    Examples:
        >>> layer = BehaviorClustering(window=4)
        >>> keys = ops.reshape(ops.arange(4, dtype="float32"), (1, 4, 1))
        >>> _, _, sizes, valid = layer(keys, keys, ops.array([[5, 7, 5, 5]]), ops.array([[True] * 4]))
        >>> ops.convert_to_numpy(sizes).tolist(), ops.convert_to_numpy(valid).tolist()
        ([[0.0, 1.0, 0.0, 3.0]], [[False, True, False, True]])

    References:
        Si et al., "TWIN V2: Scaling Ultra-Long User Behavior Sequence
        Modeling for Enhanced CTR Prediction at Kuaishou", CIKM 2024.
    """

    def __init__(self, window: int = 16, **kwargs):
        super().__init__(**kwargs)
        if window < 1:
            raise ValueError(f"BehaviorClustering: window must be >= 1, got {window}")
        self.window = window

    def call(self, keys, values, categories, mask):
        length = keys.shape[1]
        if length is None:
            raise ValueError("BehaviorClustering: the history length must be static")
        s = min(self.window, length)
        windows = -(-length // s)
        pad = windows * s - length
        mask = ops.cast(mask, "bool")

        def split(x):  # [B, L, ...] -> [B, W, S, ...], windows aligned on the most recent slot
            x = ops.pad(x, [(0, 0), (pad, 0)] + [(0, 0)] * (len(x.shape) - 2))
            return ops.reshape(x, (-1, windows, s, *x.shape[2:]))

        cats, real = split(ops.cast(categories, "int32")), split(mask)
        same = ops.logical_and(ops.equal(cats[..., :, None], cats[..., None, :]),
                               ops.logical_and(real[..., :, None], real[..., None, :]))  # [B, W, S, S]
        weights = ops.cast(same, "float32")
        window_sizes = ops.sum(weights, axis=-1)  # [B, W, S]
        later = ops.triu(ops.ones((s, s), "bool"), k=1)  # j > i
        latest = ops.logical_and(real, ops.logical_not(ops.any(ops.logical_and(same, later), axis=-1)))

        def means(x):
            sums = ops.einsum("bwij,bwjd->bwid", ops.cast(weights, x.dtype), split(x))
            mean = sums / ops.cast(ops.maximum(window_sizes, 1.0)[..., None], x.dtype)
            return ops.reshape(mean, (-1, windows * s, x.shape[-1]))[:, pad:]

        valid = ops.reshape(latest, (-1, windows * s))[:, pad:]
        sizes = ops.where(valid, ops.reshape(window_sizes, (-1, windows * s))[:, pad:], 0.0)
        gate = lambda x: x * ops.cast(ops.expand_dims(valid, -1), x.dtype)  # noqa: E731
        return gate(means(keys)), gate(means(values)), sizes, valid

    def compute_output_spec(self, keys, values, categories, mask):
        b, length = keys.shape[0], keys.shape[1]
        return (keras.KerasTensor(keys.shape, dtype=keys.dtype), keras.KerasTensor(values.shape, dtype=values.dtype),
                keras.KerasTensor((b, length), dtype="float32"), keras.KerasTensor((b, length), dtype="bool"))

    def get_config(self):
        config = super().get_config()
        config.update(window=self.window)
        return config
