"""HardTopKSearch: TWIN-hard's search, the most recent behaviours of the target's category."""

from __future__ import annotations

from keras import ops

from dare_tf.search.base import TopKSearch

from dare_tf.search.registry import register_search


def hard_search_priority(mask, target_category, history_categories):
    """Hard search's ranking `[B, L]` int32: every real slot of the target's
    category ranks above every other slot; within a group the more recent
    (larger index) ranks higher. Its top K is the reference's "most recent K of
    the category, widened by the most recent other slots". User-major
    (`target_category` `[U, N]` over `[U, L]` histories): `[U, N, L]`."""
    length = ops.shape(history_categories)[1]
    if len(target_category.shape) == 2:  # user-major
        mask, history_categories = ops.expand_dims(mask, 1), ops.expand_dims(history_categories, 1)
    same = ops.logical_and(mask, ops.equal(history_categories, ops.expand_dims(target_category, -1)))
    return ops.arange(length, dtype="int32") + ops.cast(same, "int32") * length


@register_search("hard")
class HardTopKSearch(TopKSearch):
    """Keeps the most recent K slots whose category equals the target's.

    When fewer exist, the most recent other slots fill the set up to K, as
    the reference does (`hard_search_priority`). Only the K kept slots are
    scored (scaled dot product), for the modelling stage's softmax.

    Examples:
        >>> search = HardTopKSearch(top_k=2)
        >>> out = search(ops.ones((1, 4)), ops.ones((1, 3, 4)), None, ops.array([[True, True, True]]),
        ...              ops.array([7]), ops.array([[7, 3, 3]]))
        >>> ops.convert_to_numpy(out["positions"]).tolist()
        [[0, 2]]

    References:
        Chang et al., "TWIN", KDD 2023 (the hard-search baseline of SIM:
        Pi et al., "Search-based User Interest Modeling with Lifelong
        Sequential Behavior Data for CTR Prediction", CIKM 2020).
    """

    def ranking(self, query, keys, mask, target_category=None, history_categories=None):
        if target_category is None or history_categories is None:
            raise ValueError("HardTopKSearch: needs target_category and history_categories")
        return hard_search_priority(mask, target_category, history_categories), None
