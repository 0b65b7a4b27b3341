"""TopKBehaviorSearch: the search stage that keeps K of L history behaviours."""

from __future__ import annotations

import keras
from keras import ops

from dare_tf.layers.hashing import add_projection, hamming_distance, pack_bits, simhash_bits

MODES = ("soft", "hard", "simhash")
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


def hard_search_priority(mask, target_category, history_categories):
    """Hard search's ranking `[B, L]` int32: every real slot of the target's
    category ranks above every other slot; within a group the more recent
    (larger index) ranks higher. Its top K is the reference's "most recent K of
    the category, widened by the most recent other slots"."""
    length = ops.shape(history_categories)[1]
    same = ops.logical_and(mask, ops.equal(history_categories, ops.expand_dims(target_category, -1)))
    return ops.arange(length, dtype="int32")[None, :] + ops.cast(same, "int32") * length


def hamming_priority(query_signature, key_signatures, mask, bits: int):
    """SimHash search's ranking `[B, L]` int32 from packed signatures (`pack_bits`):
    fewer differing bits first, then the more recent slot; padding below every
    real slot."""
    length = ops.shape(key_signatures)[1]
    differing = hamming_distance(query_signature, key_signatures)
    priority = (bits - differing) * length + ops.arange(length, dtype="int32")[None, :]
    return ops.where(mask, priority, -1)


@keras.saving.register_keras_serializable(package="dare_tf")
class TopKBehaviorSearch(keras.layers.Layer):
    """Retrieves the K history behaviours most relevant to the target.

    Soft search (TWIN, DARE) scores every slot with the scaled dot product of
    attention embeddings (see `scaled_dot_scores`) and keeps the top K over
    the whole history. Hard search (TWIN hard) keeps the most recent K slots
    whose category equals the target's; when fewer exist, the most recent
    other slots fill the set up to K, as the reference does. SimHash search
    (ETA) keeps the K slots whose SimHash signature (`num_bits` signs of a
    fixed random projection of the attention vector's semantic part, i.e.
    without the position part) is nearest the target's in Hamming distance,
    ties broken by recency; a history's signatures do not depend on the
    target, so they can be computed once (`signatures`) and passed in
    (`history_signatures`). Padding slots (mask False) are never valid: their
    validity is False and their score is -2**32 + 1, so a later softmax gives
    them zero weight. Every mode returns the dot-product scores (plus
    `score_bias`) of the kept slots, for the modelling stage's softmax.

    No tensor of shape `[B, L, L]` or `[B, L, vocab]` is formed: cost is
    linear in L.

    Args:
        top_k: K. When the history is shorter (L < K) all L slots are returned.
        mode: `soft`, `hard` or `simhash`.
        position_dim: width of the position part at the end of each attention
            vector, scaled separately; 0 for none.
        num_bits: SimHash signature bits (`simhash` mode).
        seed: seed of the SimHash projection (`simhash` mode).

    Call arguments:
        query: target attention embedding `[B, D]`.
        keys: history attention embeddings `[B, L, D]`.
        mask: `[B, L]` bool, True for real behaviours.
        target_category: `[B]` int, needed by hard search.
        history_categories: `[B, L]` int, needed by hard search.
        score_bias: optional float `[B, L]` added to every slot's score before
            ranking (soft mode) and in the returned scores (TWIN-V2's
            log cluster size).
        history_signatures: optional precomputed `signatures(keys)` (simhash).

    Returns:
        `(positions, scores, valid)`: slot indices `[B, K']` int32 (soft: by
        descending score; hard: most recent first; simhash: nearest first),
        their float32 scores `[B, K']`, and validity `[B, K']` bool, with
        `K' = min(K, L)`.

    Example:
    >>> search = TopKBehaviorSearch(top_k=2)
    >>> q = ops.ones((1, 4)); k = ops.reshape(ops.arange(12, dtype="float32"), (1, 3, 4))
    >>> positions, scores, valid = search(q, k, ops.array([[False, True, True]]))
    >>> ops.convert_to_numpy(positions).tolist()
    [[2, 1]]

    References:
        Chang et al., "TWIN: TWo-stage Interest Network for Lifelong User
        Behavior Modeling in CTR Prediction at Kuaishou", KDD 2023.
        Chen et al., "End-to-End User Behavior Retrieval in Click-Through Rate
        Prediction Model" (ETA), arXiv 2108.04468, 2021.
    """

    def __init__(self, top_k: int = 20, mode: str = "soft", position_dim: int = 0, num_bits: int = 32,
                 seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"TopKBehaviorSearch: mode={mode!r} is not one of {MODES}")
        if top_k < 1:
            raise ValueError(f"TopKBehaviorSearch: top_k must be >= 1, got {top_k}")
        if num_bits < 1:
            raise ValueError(f"TopKBehaviorSearch: num_bits must be >= 1, got {num_bits}")
        self.top_k = top_k
        self.mode = mode
        self.position_dim = position_dim
        self.num_bits = num_bits
        self.seed = seed
        self.projection = None

    def build(self, query_shape=None, *args, **kwargs):
        if self.mode == "simhash" and self.projection is None:
            self.projection = add_projection(self, query_shape[-1] - self.position_dim, self.num_bits, self.seed)
        self.built = True

    def signatures(self, vectors):
        """SimHash signatures of attention vectors `[..., D]` (simhash mode):
        `num_bits` bits packed 16 per int32 word, `[..., ceil(num_bits / 16)]`."""
        if self.mode != "simhash":
            raise ValueError("TopKBehaviorSearch.signatures: only mode='simhash' hashes")
        semantic = vectors[..., : vectors.shape[-1] - self.position_dim] if self.position_dim else vectors
        return pack_bits(simhash_bits(semantic, self.projection))

    def score(self, query, keys, mask, score_bias=None):
        """All masked scores `[B, L]` (float32); padding gets -2**32 + 1."""
        scores = scaled_dot_scores(query, keys, self.position_dim)
        if score_bias is not None:
            scores = scores + ops.cast(score_bias, "float32")
        return ops.where(mask, scores, PADDING_SCORE)

    def call(self, query, keys, mask, target_category=None, history_categories=None, score_bias=None,
             history_signatures=None):
        mask = ops.cast(mask, "bool")
        length = keys.shape[1]
        if length is None:
            raise ValueError("TopKBehaviorSearch: the history length (keys.shape[1]) must be static")
        k = min(self.top_k, length)
        if self.mode == "soft":
            top_scores, positions = ops.top_k(self.score(query, keys, mask, score_bias), k, sorted=True)
            positions = ops.cast(positions, "int32")
            return positions, top_scores, ops.take_along_axis(mask, positions, axis=1)
        if self.mode == "hard":
            if target_category is None or history_categories is None:
                raise ValueError("TopKBehaviorSearch: mode='hard' needs target_category and "
                                 "history_categories")
            priority = hard_search_priority(mask, target_category, history_categories)
        else:
            priority = hamming_priority(self.signatures(query),
                                        self.signatures(keys) if history_signatures is None else history_signatures,
                                        mask, self.num_bits)
        # (As float32: exact below 2**24, and XLA's CPU top-k is several times faster on floats.)
        _, positions = ops.top_k(ops.cast(priority, "float32"), k, sorted=True)
        positions = ops.cast(positions, "int32")
        # The ranking did not need the scores: only the K kept slots are scored.
        kept = ops.take_along_axis(keys, ops.expand_dims(positions, -1), axis=1)
        bias = None if score_bias is None else ops.take_along_axis(score_bias, positions, axis=1)
        valid = ops.take_along_axis(mask, positions, axis=1)
        return positions, self.score(query, kept, valid, bias), valid

    def compute_output_spec(self, query, keys, mask, target_category=None, history_categories=None,
                            score_bias=None, history_signatures=None):
        k = min(self.top_k, keys.shape[1])
        b = keys.shape[0]
        return (keras.KerasTensor((b, k), dtype="int32"),
                keras.KerasTensor((b, k), dtype="float32"),
                keras.KerasTensor((b, k), dtype="bool"))

    def get_config(self):
        config = super().get_config()
        config.update(top_k=self.top_k, mode=self.mode, position_dim=self.position_dim, num_bits=self.num_bits,
                      seed=self.seed)
        return config
