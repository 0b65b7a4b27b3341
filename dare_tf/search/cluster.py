"""ClusterTopKSearch: TWIN-V2's search, the top K clusters of the history."""

from __future__ import annotations

from keras import ops

from dare_tf.layers.clustering import BehaviorClustering
from dare_tf.search.registry import register_search
from dare_tf.search.soft import SoftTopKSearch


@register_search("cluster")
class ClusterTopKSearch(SoftTopKSearch):
    """Clusters the history (`BehaviorClustering`), then keeps the K clusters
    with the highest attention scores, `log(cluster size)` added to each.

    A cluster holds the mean attention and representation vectors of its
    members and sits at the slot of its most recent member, so `positions`
    index history slots. The modelling stage attends over the kept clusters'
    mean representations with the same (size-biased) scores.

    Args:
        window: behaviours per time window of the clustering.

    Examples:
        >>> search = ClusterTopKSearch(top_k=1, window=4)
        >>> out = search(ops.ones((1, 2)), ops.ones((1, 4, 2)), ops.ones((1, 4, 2)), ops.array([[True] * 4]),
        ...              ops.array([5]), ops.array([[5, 7, 5, 5]]))
        >>> ops.convert_to_numpy(out["positions"]).tolist()
        [[3]]

    References:
        Si et al., "TWIN V2: Scaling Ultra-Long User Behavior Sequence
        Modeling for Enhanced CTR Prediction at Kuaishou", CIKM 2024.
    """

    selects_slots = False  # the clusters' means read every slot's representation
    reference_aux_attention = False

    def __init__(self, top_k: int = 20, position_dim: int = 0, window: int = 16, **kwargs):
        super().__init__(top_k, position_dim, **kwargs)
        self.window = window
        self.clustering = BehaviorClustering(window, name="clustering")

    @classmethod
    def from_model_config(cls, config, seed=None):
        return cls(config.top_k, config.attention_pos_dim, window=config.cluster_window, name="search")

    def build(self, *args, **kwargs):
        self.clustering.built = True  # (no weights)
        self.built = True

    def clusters(self, keys, values, mask, history_categories):
        """`(keys, values, valid, score_bias)` of the clusters, `[B, L, ...]`."""
        keys, values, sizes, valid = self.clustering(keys, values, history_categories, mask)
        return keys, values, valid, ops.log(ops.maximum(sizes, 1.0))

    def _over_clusters(self, search, query, keys, values, mask, history_categories):
        """`search` (the soft search per example or user-major) over the clusters."""
        keys, cluster_values, valid, bias = self.clusters(keys, keys if values is None else values, mask,
                                                          history_categories)
        result = search(query, keys, cluster_values, valid, score_bias=bias)
        if values is None:
            result["values"] = None
        return result

    def call(self, query, keys, values, mask, target_category=None, history_categories=None):
        return self._over_clusters(super().call, query, keys, values, mask, history_categories)

    def search_users(self, query, keys, values, mask, target_category=None, history_categories=None):
        """User-major: each user's history clustered once, then all N targets scored."""
        return self._over_clusters(super().search_users, query, keys, values, mask, history_categories)

    def slot_scores(self, query, keys, mask, target_category=None, history_categories=None):
        keys, _, valid, bias = self.clusters(keys, keys, mask, history_categories)
        return self.score(query, keys, valid, bias)

    def get_config(self):
        config = super().get_config()
        config.update(window=self.window)
        return config
