"""BehaviorSearch: the abstract search stage (stage 1) of the variants that
`dare_tf.search.registry` registers.

A search stage reads the attention embeddings of the target and of the L
history behaviours and decides what the modelling stage attends over: K of the
L behaviours (TWIN, DARE, TWIN-hard, ETA), K clusters of them (TWIN-V2), every
behaviour (DIN), or hash-bucket means it pools itself (SDIM). Each variant is
one subclass in a module of its own, registered by name with
`register_search`; `ModelConfig.search` names one, and `DareModel` builds it
with `build_search` and calls it once per forward pass.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import keras
from keras import ops

from dare_tf.layers.pooling import gather_slots, gather_user_slots, user_major

__all__ = ["PADDING_SCORE", "BehaviorSearch", "SearchResult", "TopKSearch", "scaled_dot_scores"]

# The reference fills padded scores with -2**32 + 1 (reference.md, "Search").
PADDING_SCORE = -(2.0**32) + 1.0

def scaled_dot_scores(query, keys, position_dim: int = 0):
    """Attention scores `[B, L]` of keys `[B, L, D]` for a query `[B, D]`, in float32;
    user-major, `[U, N, L]` for N queries `[U, N, D]` per user over keys `[U, L, D]`
    (one product for all N: each user's keys are read once).

    With `position_dim > 0` the last `position_dim` features are the position
    part and are scaled on their own (the paper's code, github.com/thuml/DARE):
    `<q_sem, k_sem> / sqrt(d_sem) + <q_pos, k_pos> / sqrt(d_pos)`.
    """
    # Scores and softmax stay float32 under mixed precision.
    query = ops.cast(query, "float32")
    keys = ops.cast(keys, "float32")
    width = query.shape[-1]
    product = "und,uld->unl" if user_major(query) else "bd,bld->bl"
    if not position_dim:
        return ops.einsum(product, query, keys) / float(width) ** 0.5
    sem = width - position_dim
    if width is not None and sem < 1:
        raise ValueError(f"position_dim={position_dim} leaves no item/category part in attention vectors of width "
                         f"{width}: give the search its embedding's attention_position_width")
    # One product over the whole width with the query's parts pre-scaled: the [B, L, D]
    # keys are read once and never sliced (a slice is a copy outside XLA).
    scale = ops.concatenate([ops.full((sem,), float(sem) ** -0.5, "float32"),
                             ops.full((position_dim,), float(position_dim) ** -0.5, "float32")])
    return ops.einsum(product, query * scale, keys)


def slot_axis(x, query):
    """A per-slot tensor `[U, L, ...]` of the histories, broadcastable against the
    user-major scores `[U, N, L, ...]` of `query` `[U, N, D]`; as it is otherwise."""
    return ops.expand_dims(x, 1) if user_major(query) else x


def every_slot(mask):
    """Slot indices `[B, L]` int32 of a whole history (what a search that keeps every slot returns)."""
    return ops.broadcast_to(ops.arange(ops.shape(mask)[1], dtype="int32")[None, :], ops.shape(mask))


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What a search stage found for a batch, typed (`DareModel.search_stage`).

    Attributes:
        positions: `[B, K]` int32, the kept history slots (or clusters), most
            relevant first; SDIM: `[B, L]`, every slot.
        scores: `[B, K]` float32, the modelling stage's attention logits of
            the kept slots; None for a stage that pools itself.
        valid: `[B, K]` bool, which kept slots are real; None likewise.
        values: `[B, K, Dr]`, the kept representations; None for a stage that
            pools itself, or when the caller looks them up after the search.
        pooled: `[B, Dr]`, the stage's own pooling (SDIM); None otherwise.
        weights: `[B, L]`, that pooling's weights per slot; None otherwise.
        explain: the per-variant outputs (`BehaviorSearch.explain_outputs`).
    """

    positions: Any
    scores: Any = None
    valid: Any = None
    values: Any = None
    pooled: Any = None
    weights: Any = None
    explain: dict = dataclasses.field(default_factory=dict)

    @property
    def pools_itself(self) -> bool:
        """The stage pooled the history itself (`pooled`, `weights`) instead of
        keeping K slots for the modelling stage's attention."""
        return self.pooled is not None

    @classmethod
    def of(cls, found: dict) -> "SearchResult":
        """The result of a search layer's call (its dict, as `BehaviorSearch` documents it)."""
        unknown = set(found) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"a search returned unknown outputs {sorted(unknown)}")
        return cls(**found)


class BehaviorSearch(keras.layers.Layer, abc.ABC):
    """Stage 1 of a long-sequence model: what the modelling stage attends over.

    A subclass implements `call` and `slot_scores` and maps `ModelConfig`
    fields to its arguments in `from_model_config`; `score` (the masked
    scaled dot product) is shared.

    Class attributes:
        selects_slots: the result's `positions` are K slots of the history and
            the ranking reads no representation: a model with separate
            representation tables may look those up for the K kept slots only.
        keeps_top_k: the stage keeps `top_k` of something (slots, clusters),
            so `top_k` may not exceed the history length.
        reference_aux_attention: the reference's auxiliary head attends over
            every non-padded slot with this search's scores
            (`ModelConfig.aux_attention="all"`).
        explain_outputs: the names of the per-variant outputs in the result's
            `explain` (returned by `DareModel.explain` and a served model's
            `explain` signature).

    User-major search (`search_users`): N targets per user against that
    user's one history, as serving ranks candidates. The same result as
    `call` on the N copies of each history, with the U x N targets flattened
    to B = U * N (user-major order); a variant computes what does not depend
    on the target once per user (its keys, signatures, clusters) and the
    targets' scores as one `[U, N, L]` product. The base implementation
    repeats each history N times and calls `call` (exact, not cheaper);
    variants override it.

    Args:
        top_k: K, what the stage keeps (where it keeps a top K).
        position_dim: width of the position part at the end of each attention
            vector, scaled separately; 0 for none.

    Call arguments:
        query: target attention embedding `[B, Da]`.
        keys: history attention embeddings `[B, L, Da]`.
        values: history representation embeddings `[B, L, Dr]`, or `None`
            where the caller looks them up after the search (`selects_slots`).
        mask: `[B, L]` bool, True for real behaviours.
        target_category: `[B]` int.
        history_categories: `[B, L]` int.

    Returns:
        A dict: `positions` `[B, K]` int32 (what is kept, most relevant
        first), `scores` `[B, K]` float32 (the modelling stage's attention
        logits), `valid` `[B, K]` bool, `values` `[B, K, Dr]` (the kept
        representations; `None` when `values` was `None`). A stage that pools
        itself (SDIM) returns `pooled` `[B, Dr]` and `weights` `[B, L]`
        instead of `scores`, `valid` and `values`. `explain` holds per-variant
        outputs a served model returns with its explanation.
    """

    selects_slots = True
    keeps_top_k = True
    reference_aux_attention = False
    explain_outputs: tuple[str, ...] = ()  # the names in the result's `explain`
    search_name = None  # set by register_search

    def __init__(self, top_k: int = 20, position_dim: int = 0, **kwargs):
        super().__init__(**kwargs)
        if top_k < 1:
            raise ValueError(f"{type(self).__name__}: top_k must be >= 1, got {top_k}")
        if position_dim < 0:
            raise ValueError(f"{type(self).__name__}: position_dim must be >= 0, got {position_dim}")
        self.top_k = top_k
        self.position_dim = position_dim

    @classmethod
    def from_model_config(cls, config, seed: int | None = None) -> "BehaviorSearch":
        """This stage as `config` (a `ModelConfig`) describes it; `seed` is the model's."""
        return cls(top_k=config.top_k, position_dim=config.attention_pos_dim, name="search")

    def score(self, query, keys, mask, score_bias=None):
        """Masked scaled dot-product scores `[B, N]` (float32); padding gets -2**32 + 1.
        User-major (`query` `[U, N, D]`, `keys` `[U, L, D]`, `mask` and `score_bias`
        `[U, L]`): `[U, N, L]`."""
        scores = scaled_dot_scores(query, keys, self.position_dim)
        if score_bias is not None:
            scores = scores + slot_axis(ops.cast(score_bias, "float32"), query)
        return ops.where(slot_axis(ops.cast(mask, "bool"), query), scores, PADDING_SCORE)

    def kept(self, length: int) -> int:
        """How many entries the modelling stage attends over for a history of `length`."""
        return min(self.top_k, length) if self.keeps_top_k else length

    @abc.abstractmethod
    def call(self, query, keys, values, mask, target_category=None, history_categories=None) -> dict[str, Any]:
        ...

    @abc.abstractmethod
    def slot_scores(self, query, keys, mask, target_category=None, history_categories=None):
        """What the stage ranks by, `[B, N]` float32, higher first, padding
        -2**32 + 1 (N = L, or the clusters for TWIN-V2)."""

    def search_users(self, query, keys, values, mask, target_category=None, history_categories=None) -> dict:
        """`call` for N targets per user: `query` `[U, N, Da]`, `target_category`
        `[U, N]`, `keys` `[U, L, Da]`, `values` `[U, L, Dr]` or `None`, `mask` and
        `history_categories` `[U, L]`; returns `call`'s result for B = U * N
        (user-major order). Here: each history repeated N times, then `call`."""
        candidates = ops.shape(query)[1]
        repeat = lambda x: None if x is None else ops.repeat(x, candidates, axis=0)  # noqa: E731
        return self(ops.reshape(query, (-1, query.shape[-1])), repeat(keys), repeat(values), repeat(mask),
                    None if target_category is None else ops.reshape(target_category, (-1,)),
                    repeat(history_categories))

    def built_for(self, query) -> None:
        """Builds the stage (its weights) for attention vectors of `query`'s width, as
        its first `__call__` would: `search_users` is called directly."""
        if not self.built:
            self.build((None, query.shape[-1]))

    def search_only(self, query, keys, mask, target_category=None, history_categories=None, **precomputed):
        """The stage without any representation read: what the attention-dimension
        cut times (`dare_tf.analysis.dimensions`). Top-K stages return the kept positions."""
        return self.call(query, keys, None, mask, target_category, history_categories, **precomputed)["positions"]

    def get_config(self):
        config = super().get_config()
        config.update(top_k=self.top_k, position_dim=self.position_dim)
        return config


class TopKSearch(BehaviorSearch):
    """A search that ranks the L slots and keeps the K best: the subclass says how
    to rank (`ranking`); the kept slots are scored with `score`."""

    def ranking(self, query, keys, mask, target_category, history_categories, **precomputed):
        """`(priority [B, L], scores [B, L] or None)`: the ranking, and the slots' scores
        where the ranking is the scores themselves."""
        raise NotImplementedError

    def _top_k(self, query, keys, mask, target_category, history_categories, precomputed):
        """`(top values, positions [..., K] int32, whether the values are the scores)`
        of the ranking over the last axis (per example, or per target user-major)."""
        length = keys.shape[1]
        if length is None:
            raise ValueError(f"{type(self).__name__}: the history length (keys.shape[1]) must be static")
        priority, scores = self.ranking(query, keys, mask, target_category, history_categories, **precomputed)
        # (A priority as float32: exact below 2**24, and XLA's CPU top-k is several times
        # faster on floats.)
        top, positions = ops.top_k(scores if scores is not None else ops.cast(priority, "float32"),
                                   min(self.top_k, length), sorted=True)
        return top, ops.cast(positions, "int32"), scores is not None

    def call(self, query, keys, values, mask, target_category=None, history_categories=None, **precomputed):
        mask = ops.cast(mask, "bool")
        top, positions, are_scores = self._top_k(query, keys, mask, target_category, history_categories,
                                                 precomputed)
        valid = ops.take_along_axis(mask, positions, axis=1)
        # A ranking that is not the scores: only the K kept slots are scored.
        top_scores = top if are_scores else self.score(query, gather_slots(keys, positions), valid)
        return {"positions": positions, "scores": top_scores, "valid": valid,
                "values": None if values is None else gather_slots(values, positions), "explain": {}}

    def search_users(self, query, keys, values, mask, target_category=None, history_categories=None,
                     **precomputed):
        """User-major: the ranking of all N targets as one `[U, N, L]` product, the
        top K per target, the kept slots gathered from each user's one history."""
        self.built_for(query)
        mask = ops.cast(mask, "bool")
        top, positions, are_scores = self._top_k(query, keys, mask, target_category, history_categories,
                                                 precomputed)  # [U, N, K]
        k = positions.shape[-1]
        valid = gather_user_slots(mask, positions)  # [B, K]
        top_scores = (ops.reshape(top, (-1, k)) if are_scores else
                      self.score(ops.reshape(query, (-1, query.shape[-1])), gather_user_slots(keys, positions), valid))
        return {"positions": ops.reshape(positions, (-1, k)), "scores": top_scores, "valid": valid,
                "values": None if values is None else gather_user_slots(values, positions), "explain": {}}

    def slot_scores(self, query, keys, mask, target_category=None, history_categories=None):
        mask = ops.cast(mask, "bool")
        priority, scores = self.ranking(query, keys, mask, target_category, history_categories)
        return scores if scores is not None else ops.where(mask, ops.cast(priority, "float32"), PADDING_SCORE)
