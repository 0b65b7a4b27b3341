"""Multi-source candidates: the two-tower model's top items merged with the most
popular items and with the most popular items of the user's recent categories.

Each source is a class with `top_k(query, k)`: a user's first `k` proposals,
as catalogue slots and their ranks in the source's order (rank 0 first; a
source that proposes fewer than `k` fills the rest with slot -1 at rank
infinity). No source materialises a rank over the whole catalogue:

- `two_tower`: the query tower's dot product with every candidate vector (its
  first `depth` items);
- `popularity`: the items most clicked as training targets, the same for
  everybody;
- `recent_categories`: the user's last `recent` distinct categories, most
  recent first; the items of each by their clicks, interleaved across those
  categories.

Merging with named quotas `q` (a dict, one share per source, summing to 1)
orders the catalogue by `min over sources of (rank + 1) / q`: a weighted interleave of
the sources' lists in which an item proposed by several comes once, at its
best place. A quota of 1 on one source is that source alone. Items the user
already clicked are excluded unless `include_seen`. `train_retrieval` picks
the quotas that give the validation positives the highest recall at the
largest reported K (each source alone among the choices), so the merged list
does at least as well as its best source there; `evaluate_cascade`,
`serving.export` and `recommend` use the run's quotas.

The merged first `n` read each source's first `n + L` proposals (L: the
history's length), which is exact: an item further down a source has `n + L`
items of that source before it, at most L of them seen, so `n` unseen items
with smaller keys. Slots no source proposes fill the list last, by slot, where
fewer than `n` remain (the lowest `2n` slots); the user's own items come after
every other slot, so one is returned only where the proposals and those slots hold
fewer than `n` others. Per user that costs the tower's scores over the catalogue
(one matrix product, inherent to a two-tower model) and its top-k, then sorts over
the sources' `3 (n + L)` proposals.

One implementation (TensorFlow ops) serves evaluation (eagerly, on numpy
arrays) and the exported retrieval SavedModel (in its graph).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import tensorflow as tf

from dare_tf.signatures import CANDIDATE_ORIGINS, CANDIDATE_SOURCES

# The sources, and what placed a merged candidate (`CandidateMerger.merge(with_origins=True)`):
# a source, the filler (no source proposed it), or the user's own clicks; owned by
# `dare_tf.signatures` (the retrieval export's `sources` output, read without TensorFlow).
SOURCES, ORIGINS = CANDIDATE_SOURCES, CANDIDATE_ORIGINS
RECENT_CATEGORIES = 3


@dataclasses.dataclass(frozen=True)
class Query:
    """What the sources read of a batch of users: the tower's scores of every
    catalogue slot `[B, C]` and the dense histories `[B, L]` (0 = padding,
    oldest first)."""

    tower_scores: Any
    hist_items: Any
    hist_categories: Any


def _pad(slots, ranks, k):
    """`slots`, `ranks` `[B, m]` (m <= k) padded to `[B, k]` with slot -1 at rank inf."""
    missing = k - tf.shape(slots)[1]
    return (tf.pad(slots, [[0, 0], [0, missing]], constant_values=-1),
            tf.pad(ranks, [[0, 0], [0, missing]], constant_values=np.inf))


BLOCKED_FROM = 1 << 16  # catalogues from this size take their top-k by blocks (`blocked_top_k`)


def blocked_top_k(scores, k, keep: int):
    """The indices `[B, k]` of each row's `k` highest `scores` (`[B, C]`, C static;
    `k <= keep`, `keep` static), best first, ties by the lower index, as
    `tf.math.top_k` gives them, up to ties at the k-th score: the row is cut into
    blocks of about `sqrt(C / keep)` slots, and the `k` highest lie in the `keep`
    blocks of highest maximum (a block holding one of them has a maximum at least
    the k-th score, and at most `k - 1` other blocks can exceed it without
    their maxima being among the `k` highest). One pass over the row for the
    maxima and two top-ks over about `sqrt(C * keep)` values, where a top-k over
    the whole row costs several passes: at 4.16M items, the costliest step of a
    query after its matrix product."""
    size = int(scores.shape[1])
    block = max(1, int(np.ceil(np.sqrt(size / keep))))
    blocks = -(-size // block)
    batch = tf.shape(scores)[0]
    padded = tf.pad(scores, [[0, 0], [0, blocks * block - size]], constant_values=-np.inf)
    padded = tf.reshape(padded, [batch, blocks, block])
    chosen = tf.sort(tf.math.top_k(tf.reduce_max(padded, axis=2), k=keep).indices, axis=1)  # (slot order: ties)
    values = tf.reshape(tf.gather(padded, chosen, batch_dims=1), [batch, keep * block])
    top = tf.math.top_k(values, k=k).indices
    return tf.gather(chosen, top // block, batch_dims=1) * block + top % block


class TwoTowerSource(tf.Module):
    """The query tower's `depth` best-scoring slots (ties: the lower slot first; in a
    catalogue of `BLOCKED_FROM` items or more, through `blocked_top_k`)."""

    name = "two_tower"

    def __init__(self, depth: int):
        super().__init__()
        self.depth = int(depth)

    def top_k(self, query: Query, k):
        size = tf.shape(query.tower_scores)[1]
        m = tf.minimum(tf.minimum(k, self.depth), size)
        static = query.tower_scores.shape[1]
        if static is not None and static >= max(BLOCKED_FROM, self.depth):
            slots = blocked_top_k(query.tower_scores, m, self.depth)
        else:
            slots = tf.math.top_k(query.tower_scores, k=m).indices
        ranks = tf.tile(tf.range(m, dtype=tf.float32)[None], [tf.shape(slots)[0], 1])
        return _pad(slots, ranks, k)


class PopularitySource(tf.Module):
    """The slots most clicked as training targets, the same for everybody (ties:
    the lower slot first). `clicks`: each slot's `[C]`."""

    name = "popularity"

    def __init__(self, clicks):
        super().__init__()
        clicks = np.asarray(clicks, np.float64)
        self.order = tf.constant(np.lexsort((np.arange(len(clicks)), -clicks)).astype(np.int32))

    def top_k(self, query: Query, k):
        m = tf.minimum(k, tf.size(self.order))
        batch = tf.shape(query.hist_items)[0]
        slots = tf.tile(self.order[None, :m], [batch, 1])
        return _pad(slots, tf.tile(tf.range(m, dtype=tf.float32)[None], [batch, 1]), k)


class RecentCategorySource(tf.Module):
    """The items of the user's last `recent` distinct categories (most recent
    first), each category's by clicks (ties: the lower slot first), interleaved:
    the item at place w of the category of recency j has rank `w * recent + j`.

    Args:
        item_category: each slot's dense category `[C]`.
        clicks: each slot's training-target clicks `[C]`.
        num_categories: the category vocabulary's size.
        recent: how many of the user's last distinct categories are read.
    """

    name = "recent_categories"

    def __init__(self, item_category, clicks, num_categories: int, recent: int = RECENT_CATEGORIES):
        super().__init__()
        item_category = np.asarray(item_category, np.int64)
        clicks = np.asarray(clicks, np.float64)
        size = len(item_category)
        self.recent, self.num_categories = int(recent), int(num_categories)
        # Each category's items, by clicks, one after another (a CSR list).
        by_category = np.lexsort((np.arange(size), -clicks, item_category))
        counts = np.bincount(item_category, minlength=num_categories)
        self.members = tf.constant(by_category.astype(np.int32))
        self.starts = tf.constant((np.cumsum(counts) - counts).astype(np.int32))
        self.counts = tf.constant(counts.astype(np.int32))

    def recent_categories(self, hist_items, hist_categories):
        """The user's last `recent` distinct categories `[B, recent]`, most recent first
        (-1 where the history holds fewer)."""
        batch, length = tf.shape(hist_items)[0], tf.shape(hist_items)[1]
        position = tf.where(hist_items > 0, tf.range(length, dtype=tf.int32)[None], -1)
        segment = tf.cast(hist_categories, tf.int32) + tf.range(batch)[:, None] * self.num_categories
        last = tf.math.unsorted_segment_max(tf.reshape(position, [-1]), tf.reshape(segment, [-1]),
                                            batch * self.num_categories)
        last = tf.maximum(tf.reshape(last, [batch, self.num_categories]), -1)  # (empty segments: int min)
        last = tf.concat([tf.fill([batch, 1], -1), last[:, 1:]], axis=1)  # category 0 is padding
        top = tf.math.top_k(last, k=min(self.recent, self.num_categories))
        return tf.where(top.values >= 0, top.indices, -1)

    def top_k(self, query: Query, k):
        categories = self.recent_categories(query.hist_items, query.hist_categories)  # [B, R]
        width = tf.shape(categories)[1]
        per = (k + width - 1) // width  # items read per category
        places = tf.range(per)  # [P]
        safe = tf.maximum(categories, 0)
        valid = (categories[:, :, None] >= 0) & (places[None, None] < tf.gather(self.counts, safe)[:, :, None])
        slots = tf.gather(self.members, tf.minimum(tf.gather(self.starts, safe)[:, :, None] + places[None, None],
                                                   tf.size(self.members) - 1))
        ranks = tf.cast(places[None, None] * self.recent + tf.range(width)[None, :, None], tf.float32)
        batch = tf.shape(categories)[0]
        slots = tf.reshape(tf.where(valid, slots, -1), [batch, -1])
        ranks = tf.reshape(tf.where(valid, ranks, np.inf), [batch, -1])
        order = tf.argsort(ranks, axis=1, stable=True)[:, :k]
        return _pad(tf.gather(slots, order, batch_dims=1), tf.gather(ranks, order, batch_dims=1), k)


def quota_grid(step: float = 0.25) -> list[dict[str, float]]:
    """Every quota dict on a `step` grid summing to 1, each source alone first."""
    parts = int(round(1 / step))
    grid = [tuple(c / parts for c in combo) for combo in itertools.product(range(parts + 1), repeat=len(SOURCES))
            if sum(combo) == parts]
    return [dict(zip(SOURCES, q)) for q in sorted(grid, key=lambda q: (-max(q), [-v for v in q]))]


def one_source(name: str) -> dict[str, float]:
    """The quotas of one source alone."""
    return {s: float(s == name) for s in SOURCES}


def quota_key(quotas: dict) -> tuple[float, ...]:
    """A quota dict as a hashable key (the shares in `SOURCES` order)."""
    return tuple(float(quotas.get(s, 0.0)) for s in SOURCES)


class CandidateMerger(tf.Module):
    """The sources over a catalogue of `len(item_category)` slots (slot s is dense
    item id s + 1, as `dare_tf.retrieval.training.catalogue` lists it) and their
    merge by named quotas.

    Args:
        item_category: dense category id of each catalogue slot `[C]`.
        clicks: training-target clicks of each slot `[C]`.
        num_categories: size of the category vocabulary.
        depth: how many of the two-tower model's first items it proposes.
        recent: how many of the user's last distinct categories are read.
    """

    def __init__(self, item_category, clicks, num_categories: int, depth: int, recent: int = RECENT_CATEGORIES):
        super().__init__()
        self.size = len(item_category)
        self.sources = {s.name: s for s in (TwoTowerSource(depth), PopularitySource(clicks),
                                            RecentCategorySource(item_category, clicks, num_categories, recent))}

    def proposals(self, query: Query, n: int) -> dict:
        """Each source's first `n + L` proposals (what a merge of `n` reads), by name."""
        k = n + tf.shape(query.hist_items)[1]
        return {name: source.top_k(query, k) for name, source in self.sources.items()}

    def merge(self, proposals: dict, quotas: dict, hist_items, n: int, include_seen: bool = False,
              with_origins: bool = False):
        """The first `n` slots `[B, n]` (int32) of the merged order (see the module),
        the user's clicks (`hist_items`, dense `[B, L]`) excluded unless `include_seen`.
        With `with_origins`, also each slot's origin `[B, n]` (int32): the index in
        `ORIGINS` of the source that placed it (the one of its smallest key), or of
        `filler` (no source proposed it) or `seen` (the user's own item, placed last)."""
        unknown = set(quotas) - set(self.sources)
        if unknown:
            raise ValueError(f"quotas of unknown sources {sorted(unknown)}; the sources: {list(self.sources)}")
        slots, keys, origins = [], [], []
        for name, (ids, ranks) in proposals.items():
            quota = float(quotas.get(name, 0.0))
            if quota > 0:
                slots.append(ids)
                keys.append(tf.where(ids >= 0, (ranks + 1.0) / quota, np.inf))
                origins.append(tf.fill(tf.shape(ids), ORIGINS.index(name)))
        batch = tf.shape(hist_items)[0]
        # The lowest 2n slots at key inf fill the list where fewer than n are proposed.
        filler = tf.range(tf.minimum(2 * n, self.size), dtype=tf.int32)
        slots = tf.concat(slots + [tf.tile(filler[None], [batch, 1])], axis=1)
        keys = tf.concat(keys + [tf.fill([batch, tf.size(filler)], np.inf)], axis=1)
        # (a proposal at key inf, past its source's list, counts as filler)
        origins = tf.where(tf.math.is_inf(keys), ORIGINS.index("filler"),
                           tf.concat(origins + [tf.fill([batch, tf.size(filler)], ORIGINS.index("filler"))], axis=1))
        seen = tf.sort(tf.cast(hist_items, tf.int32) - 1, axis=1)

        def clicked(slots):  # [B, M] bool: the user's own items (none with include_seen)
            if include_seen:
                return tf.zeros_like(slots, tf.bool)
            at = tf.minimum(tf.searchsorted(seen, slots), tf.shape(seen)[1] - 1)
            return tf.gather(seen, at, batch_dims=1) == slots

        keys = tf.where(clicked(slots), np.inf, keys)
        origins = tf.where(clicked(slots), ORIGINS.index("seen"), origins)

        def gather(order, *tensors):
            return [tf.gather(t, order, batch_dims=1) for t in tensors]

        # Each slot once, at its smallest key; then by key, ties (and inf) by slot.
        slots = tf.where(slots >= 0, slots, self.size)  # (no proposal: dropped below)
        slots, keys, origins = gather(tf.argsort(keys, axis=1, stable=True), slots, keys, origins)
        # by slot, each slot's smallest key first
        slots, keys, origins = gather(tf.argsort(slots, axis=1, stable=True), slots, keys, origins)
        first = tf.concat([tf.ones_like(slots[:, :1], tf.bool), slots[:, 1:] != slots[:, :-1]], axis=1)
        # Kept first, then the user's own items (only where fewer than n others remain), then dropped.
        drop = 2 * tf.cast(~first | (slots >= self.size), tf.int32) + tf.cast(clicked(slots), tf.int32)
        # by key; equal keys stay by slot
        slots, drop, origins = gather(tf.argsort(keys, axis=1, stable=True), slots, drop, origins)
        slots, origins = gather(tf.argsort(drop, axis=1, stable=True)[:, :n], slots, origins)
        return (slots, origins) if with_origins else slots
