"""FullHistorySearch: no search (DIN), attention over every behaviour."""

from __future__ import annotations

from keras import ops

from dare_tf.search import SCORERS
from dare_tf.layers.din_attention import DINAttention
from dare_tf.search.base import PADDING_SCORE, BehaviorSearch, every_slot, scaled_dot_scores
from dare_tf.search.registry import offset_seed, register_search


@register_search("none")
class FullHistorySearch(BehaviorSearch):
    """Keeps every behaviour: the modelling stage attends over the whole history.

    The attention logits are the scaled dot product of attention embeddings
    (`scorer="dot"`) or DIN's activation unit (`scorer="din"`,
    `DINAttention`). Cost is linear in L per target, which is what the
    two-stage models avoid at long L.

    Args:
        scorer: `dot` or `din`.
        din_units: `DINAttention`'s hidden width (`scorer="din"`).
        initializer: `DINAttention`'s initializer (`scorer="din"`).
        prelu_init: `DINAttention`'s initial PReLU slope (`scorer="din"`).
        l2: `DINAttention`'s L2 penalty (`scorer="din"`).
        seed: `DINAttention`'s seed (`scorer="din"`).
        top_k: unused (every slot is kept); accepted for a uniform constructor.

    Examples:
        >>> search = FullHistorySearch()
        >>> out = search(ops.ones((1, 4)), ops.ones((1, 3, 4)), ops.ones((1, 3, 2)), ops.array([[False, True, True]]))
        >>> ops.convert_to_numpy(out["valid"]).tolist()
        [[False, True, True]]

    References:
        Zhou et al., "Deep Interest Network for Click-Through Rate
        Prediction", KDD 2018, https://arxiv.org/abs/1706.06978
    """

    selects_slots = False
    keeps_top_k = False

    def __init__(self, position_dim: int = 0, scorer: str = "dot", din_units: int = 36,
                 initializer: str = "keras", prelu_init: float = 0.1, l2: float = 0.0, seed: int | None = None,
                 top_k: int = 1, **kwargs):
        super().__init__(top_k, position_dim, **kwargs)
        if scorer not in SCORERS:
            raise ValueError(f"FullHistorySearch: scorer={scorer!r} is not one of {SCORERS}")
        self.scorer, self.din_units, self.initializer = scorer, din_units, initializer
        self.prelu_init, self.l2, self.seed = prelu_init, l2, seed
        self.din_attention = None
        if scorer == "din":
            self.din_attention = DINAttention(din_units, initializer=initializer, prelu_init=prelu_init, l2=l2,
                                              seed=seed, name="din_attention")

    @classmethod
    def from_model_config(cls, config, seed=None):
        return cls(config.attention_pos_dim, scorer=config.scorer, din_units=config.din_units,
                   initializer=config.initializer, prelu_init=config.prelu_init, l2=config.l2,
                   seed=offset_seed(seed, 100), name="search")

    def build(self, query_shape=None, keys_shape=None, *args, **kwargs):
        if self.din_attention is not None and not self.din_attention.built:
            self.din_attention.build(query_shape, keys_shape)
        self.built = True

    def slot_scores(self, query, keys, mask, target_category=None, history_categories=None):
        if self.din_attention is not None:
            scores = ops.cast(self.din_attention(query, keys), "float32")
        else:
            scores = scaled_dot_scores(query, keys, self.position_dim)
        return ops.where(ops.cast(mask, "bool"), scores, PADDING_SCORE)

    def call(self, query, keys, values, mask, target_category=None, history_categories=None):
        mask = ops.cast(mask, "bool")
        return {"positions": every_slot(mask), "scores": self.slot_scores(query, keys, mask), "valid": mask,
                "values": values, "explain": {}}

    def search_only(self, query, keys, mask, target_category=None, history_categories=None):
        return self.slot_scores(query, keys, mask)

    def get_config(self):
        config = super().get_config()
        config.update(scorer=self.scorer, din_units=self.din_units, initializer=self.initializer,
                      prelu_init=self.prelu_init, l2=self.l2, seed=self.seed)
        return config
