"""TopKBehaviorSearch: the search stage that keeps K of L history behaviours."""

from __future__ import annotations

import keras
from keras import ops

MODES = ("soft", "hard")
# The reference fills padded scores with -2**32 + 1 (reference.md, "Search").
PADDING_SCORE = -(2.0**32) + 1.0


def scaled_dot_scores(query, keys, position_dim: int = 0):
    """Attention scores `[B, L]` of keys `[B, L, D]` for a query `[B, D]`, in float32.

    With `position_dim > 0` the last `position_dim` features are the position
    part and are scaled on their own (reference.md):
    `<q_sem, k_sem> / sqrt(d_sem) + <q_pos, k_pos> / sqrt(d_pos)`.
    """
    # Scores and softmax stay float32 under mixed precision.
    query = ops.cast(query, "float32")
    keys = ops.cast(keys, "float32")
    width = query.shape[-1]
    if not position_dim:
        return ops.einsum("bd,bld->bl", query, keys) / float(width) ** 0.5
    sem = width - position_dim
    # One product over the whole width with the query's parts pre-scaled: the [B, L, D]
    # keys are read once and never sliced (a slice is a copy outside XLA).
    scale = ops.concatenate([ops.full((sem,), float(sem) ** -0.5, "float32"),
                             ops.full((position_dim,), float(position_dim) ** -0.5, "float32")])
    return ops.einsum("bd,bld->bl", query * scale, keys)


@keras.saving.register_keras_serializable(package="dare_tf")
class TopKBehaviorSearch(keras.layers.Layer):
    """Retrieves the K history behaviours most relevant to the target.

    Soft search (TWIN, DARE) scores every slot with the scaled dot product of
    attention embeddings (see `scaled_dot_scores`) and keeps the top K over
    the whole history. Hard search (TWIN hard) keeps the most recent K slots
    whose category equals the target's; when fewer exist, the most recent
    other slots fill the set up to K, as the reference does. Padding slots
    (mask False) are never valid: their validity is False and their score is
    -2**32 + 1, so a later softmax gives them zero weight.

    No tensor of shape `[B, L, L]` or `[B, L, vocab]` is formed: cost is
    linear in L.

    Args:
        top_k: K. When the history is shorter (L < K) all L slots are returned.
        mode: `soft` or `hard`.
        position_dim: width of the position part at the end of each attention
            vector, scaled separately; 0 for none.

    Call arguments:
        query: target attention embedding `[B, D]`.
        keys: history attention embeddings `[B, L, D]`.
        mask: `[B, L]` bool, True for real behaviours.
        target_category: `[B]` int, needed by hard search.
        history_categories: `[B, L]` int, needed by hard search.

    Returns:
        `(positions, scores, valid)`: slot indices `[B, K']` int32 (soft: by
        descending score; hard: most recent first), their float32 scores
        `[B, K']`, and validity `[B, K']` bool, with `K' = min(K, L)`.

    Example:
    >>> search = TopKBehaviorSearch(top_k=2)
    >>> q = ops.ones((1, 4)); k = ops.reshape(ops.arange(12, dtype="float32"), (1, 3, 4))
    >>> positions, scores, valid = search(q, k, ops.array([[False, True, True]]))
    >>> ops.convert_to_numpy(positions).tolist()
    [[2, 1]]

    References:
        Chang et al., "TWIN: TWo-stage Interest Network for Lifelong User
        Behavior Modeling in CTR Prediction at Kuaishou", KDD 2023.
    """

    def __init__(self, top_k: int = 20, mode: str = "soft", position_dim: int = 0, **kwargs):
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"TopKBehaviorSearch: mode={mode!r} is not one of {MODES}")
        if top_k < 1:
            raise ValueError(f"TopKBehaviorSearch: top_k must be >= 1, got {top_k}")
        self.top_k = top_k
        self.mode = mode
        self.position_dim = position_dim

    def score(self, query, keys, mask):
        """All masked scores `[B, L]` (float32); padding gets -2**32 + 1."""
        scores = scaled_dot_scores(query, keys, self.position_dim)
        return ops.where(mask, scores, PADDING_SCORE)

    def call(self, query, keys, mask, target_category=None, history_categories=None):
        mask = ops.cast(mask, "bool")
        length = keys.shape[1]
        if length is None:
            raise ValueError("TopKBehaviorSearch: the history length (keys.shape[1]) must be static")
        k = min(self.top_k, length)
        scores = self.score(query, keys, mask)
        if self.mode == "soft":
            top_scores, positions = ops.top_k(scores, k, sorted=True)
        else:
            if target_category is None or history_categories is None:
                raise ValueError("TopKBehaviorSearch: mode='hard' needs target_category and "
                                 "history_categories")
            same = ops.logical_and(
                mask, ops.equal(history_categories, ops.expand_dims(target_category, -1)))
            # Priority: every same-category slot ranks above every other slot;
            # within a group the more recent (larger index) ranks higher. The
            # top K is then the reference's "most recent K of the category,
            # widened by the most recent other slots".
            recency = ops.arange(length, dtype="int32")[None, :]
            priority = recency + ops.cast(same, "int32") * length
            _, positions = ops.top_k(priority, k, sorted=True)
            top_scores = ops.take_along_axis(scores, positions, axis=1)
        positions = ops.cast(positions, "int32")
        valid = ops.take_along_axis(mask, positions, axis=1)
        return positions, top_scores, valid

    def compute_output_spec(self, query, keys, mask, target_category=None, history_categories=None):
        k = min(self.top_k, keys.shape[1])
        b = keys.shape[0]
        return (keras.KerasTensor((b, k), dtype="int32"),
                keras.KerasTensor((b, k), dtype="float32"),
                keras.KerasTensor((b, k), dtype="bool"))

    def get_config(self):
        config = super().get_config()
        config.update(top_k=self.top_k, mode=self.mode, position_dim=self.position_dim)
        return config
