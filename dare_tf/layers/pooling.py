"""TargetAttentionPooling: the modelling stage over retrieved behaviours."""

from __future__ import annotations

import keras
from keras import ops


def masked_softmax(scores, mask):
    """Softmax over the last axis of float32 `scores` where `mask`; 0 elsewhere.

    A row with no valid entry gets all-zero weights (never NaN).
    """
    scores = ops.cast(scores, "float32")
    mask = ops.cast(mask, "bool")
    scores = ops.where(mask, scores, ops.full_like(scores, -1e30))
    scores = scores - ops.stop_gradient(ops.max(scores, axis=-1, keepdims=True))
    weights = ops.where(mask, ops.exp(scores), ops.zeros_like(scores))
    total = ops.sum(weights, axis=-1, keepdims=True)
    return weights / ops.maximum(total, 1e-30)


def gather_slots(values, positions):
    """`values[b, positions[b, k]]`: `[B, L, ...]` -> `[B, K, ...]` (the kept slots).
    On JAX with a gradient mode other than `xla` (a GPU's), `table_gradients.take` of
    the `[B * L, ...]` rows: a gradient of `[B * K]` rows scattered, not
    `take_along_axis`'s scatter into a transposed `[B, ..., L]`."""
    index = ops.cast(positions, "int32")
    if keras.backend.backend() == "jax":
        from dare_tf.layers import table_gradients  # (JAX's: imported on that backend only)

        if table_gradients.current_mode() != "xla":
            return table_gradients.take_slots(values, index)
    for _ in range(len(values.shape) - 2):
        index = ops.expand_dims(index, -1)
    return ops.take_along_axis(values, index, axis=1)


def user_major(query) -> bool:
    """Whether `query` holds N targets per user, `[U, N, D]` (serving's ranking of
    candidates against each user's one history), rather than one per example `[B, D]`."""
    return len(query.shape) == 3


def gather_user_slots(values, positions):
    """`values[u, positions[u, n, k]]` flattened to the U * N targets: `[U, L, ...]`
    and `[U, N, K]` -> `[U * N, K, ...]`, read from each user's one copy (no
    `[U, N, L, ...]` intermediate)."""
    positions = ops.cast(positions, "int32")
    users, length = ops.shape(values)[0], ops.shape(values)[1]
    index = positions + ops.reshape(ops.arange(users, dtype="int32") * length, (-1, 1, 1))
    flat = ops.reshape(values, (-1, *values.shape[2:]))
    return ops.reshape(ops.take(flat, ops.reshape(index, (-1,)), axis=0),
                       (-1, positions.shape[-1], *values.shape[2:]))


def target_aware(target, pooled):
    """`concat(h, v_t * h)`: the pooled vector and the paper's target-aware
    representation (TR)."""
    return ops.concatenate([pooled, ops.cast(target, pooled.dtype) * pooled], axis=-1)


def head_features(v_t, pooled, values, mask, config, candidates=None):
    """The prediction head's input: the target's representation `v_t`, the pooled
    history and (with `config.use_history_mean`) the history's mean over `mask`
    (with `config.target_aware`, also `v_t` times it), each user's mean repeated
    for its `candidates` (user-major ranking)."""
    features = [v_t, pooled]
    if config.use_history_mean:
        m = ops.cast(ops.expand_dims(mask, -1), values.dtype)
        mean = ops.sum(values * m, axis=1) / (ops.sum(m, axis=1) + 1.0)
        if candidates is not None:  # one mean per user, for each of its candidates
            mean = ops.repeat(mean, candidates, axis=0)
        features += [mean, v_t * mean] if config.target_aware else [mean]
    return ops.concatenate(features, axis=-1)


@keras.saving.register_keras_serializable(package="dare_tf")
class TargetAttentionPooling(keras.layers.Layer):
    """Attention-weighted sum of retrieved representation vectors, target-aware.

    With weights `w = softmax(scores)` over valid slots (float32),
    `h = sum_i w_i e_i`; with `target_aware=True` the output is
    `concat(h, v_t * h)`, where `v_t * h = sum_i w_i (e_i * v_t)` is the
    paper's target-aware representation (TR).

    Args:
        target_aware: also return the target-aware representation `v_t * h`.

    Call arguments:
        target: target representation `v_t` `[B, D]`.
        values: history representations `[B, L, D]`.
        scores: attention scores `[B, K]` of the slots to pool.
        mask: `[B, K]` bool, False for padding (weight 0).
        positions: `[B, K]` int slot indices into `values`; `None` pools
            `values` directly (then K = L).
        return_attention_weights: also return the weights `[B, K]`.

    User-major (N targets per user over each user's one history): `scores`
    `[U, N, L]`, `values` `[U, L, D]`, `mask` `[U, L]`, `target` `[U * N, D]`
    pool every slot without repeating the histories; the output is
    `[U * N, ...]` and the weights `[U * N, L]`.

    Returns:
        `[B, 2D]` (`[B, D]` without `target_aware`), and the weights if asked.
        A row without any valid slot pools to zeros.

    Examples:
        >>> pool = TargetAttentionPooling()
        >>> out = pool(ops.ones((1, 2)), ops.ones((1, 3, 2)), ops.zeros((1, 2)),
        ...            ops.array([[True, False]]), positions=ops.array([[2, 0]]))
        >>> tuple(out.shape)
        (1, 4)

    References:
        Feng et al., "Long-Sequence Recommendation Models Need Decoupled
        Embeddings", ICLR 2025, Eq. for target-aware representation.
    """

    def __init__(self, target_aware: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.target_aware = target_aware

    def call(self, target, values, scores, mask, positions=None, return_attention_weights=False):
        if len(scores.shape) == 3:  # user-major: [U, N, L] over [U, L, D]
            weights = masked_softmax(scores, ops.expand_dims(mask, 1))
            pooled = ops.reshape(ops.einsum("unl,uld->und", ops.cast(weights, values.dtype), values),
                                 (-1, values.shape[-1]))
            weights = ops.reshape(weights, (-1, scores.shape[-1]))
        else:
            weights = masked_softmax(scores, mask)  # [B, K] float32
            if positions is not None:
                values = gather_slots(values, positions)  # [B, K, D]
            pooled = ops.einsum("bk,bkd->bd", ops.cast(weights, values.dtype), values)
        if self.target_aware:
            pooled = target_aware(target, pooled)
        if return_attention_weights:
            return pooled, weights
        return pooled

    def compute_output_spec(self, target, values, scores, mask, positions=None,
                            return_attention_weights=False):
        width = values.shape[-1] * (2 if self.target_aware else 1)
        pooled = keras.KerasTensor((values.shape[0], width), dtype=self.compute_dtype)
        if return_attention_weights:
            return pooled, keras.KerasTensor(scores.shape, dtype="float32")
        return pooled

    def get_config(self):
        config = super().get_config()
        config.update(target_aware=self.target_aware)
        return config
