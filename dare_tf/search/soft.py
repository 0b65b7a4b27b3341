"""SoftTopKSearch: TWIN's and DARE's search, the top K by attention score."""

from __future__ import annotations

from dare_tf.search.base import TopKSearch

from dare_tf.search.registry import register_search


@register_search("soft")
class SoftTopKSearch(TopKSearch):
    """Keeps the K slots with the highest attention scores over the whole history.

    Each slot's score is the scaled dot product of the target's and the
    behaviour's attention embeddings,
    `<q_sem, k_sem> / sqrt(d_sem) + <q_pos, k_pos> / sqrt(d_pos)`
    (`scaled_dot_scores`); the kept slots' scores are the modelling stage's
    attention logits. With DARE's decoupled tables the attention embeddings
    are the smaller attention table's, which makes this stage cheaper.

    Examples:
        >>> search = SoftTopKSearch(top_k=2)
        >>> q = ops.ones((1, 4)); k = ops.reshape(ops.arange(12, dtype="float32"), (1, 3, 4))
        >>> out = search(q, k, None, ops.array([[False, True, True]]))
        >>> ops.convert_to_numpy(out["positions"]).tolist()
        [[2, 1]]

    References:
        Chang et al., "TWIN: TWo-stage Interest Network for Lifelong User
        Behavior Modeling in CTR Prediction at Kuaishou", KDD 2023.
        Feng et al., "Long-Sequence Recommendation Models Need Decoupled
        Embeddings", ICLR 2025.
    """

    reference_aux_attention = True

    def ranking(self, query, keys, mask, target_category=None, history_categories=None, score_bias=None):
        return None, self.score(query, keys, mask, score_bias)
