"""Multi-source candidates: the two-tower model's top items merged with the most
popular items and with the most popular items of the user's recent categories.

Each source ranks the catalogue for a user (rank 0 first; items a source does
not propose rank at infinity):

- `two_tower`: the query tower's dot product with every candidate vector (its
  first `depth` items);
- `popularity`: the items most clicked as training targets, the same for
  everybody;
- `recent_categories`: the user's last `recent` distinct categories, most
  recent first; the items of each by their clicks, interleaved across those
  categories.

Merging with quotas `q` (one share per source, summing to 1) orders the
catalogue by `min over sources of (rank + 1) / q`: a weighted interleave of
the sources' lists in which an item proposed by several comes once, at its
best place. A quota of 1 on one source is that source alone. Items the user
already clicked are excluded unless `include_seen`. `train_retrieval` picks
the quotas that give the validation positives the highest recall at the
largest reported K (each source alone among the choices), so the merged list
does at least as well as its best source there; `evaluate_cascade`,
`serving.export` and `recommend` use the run's quotas.

One implementation (TensorFlow ops) serves evaluation (eagerly, on numpy
arrays) and the exported retrieval SavedModel (in its graph).
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

SOURCES = ("two_tower", "popularity", "recent_categories")
RECENT_CATEGORIES = 3


def quota_grid(step: float = 0.25) -> list[tuple[float, ...]]:
    """Every quota triple on a `step` grid summing to 1, each source alone first."""
    parts = int(round(1 / step))
    grid = [tuple(c / parts for c in combo) for combo in itertools.product(range(parts + 1), repeat=len(SOURCES))
            if sum(combo) == parts]
    return sorted(grid, key=lambda q: (-max(q), [-v for v in q]))


class CandidateMerger(tf.Module):
    """The sources' ranks and their merge over a catalogue of `len(item_category)`
    slots (slot s is dense item id s + 1, as `dare_tf.retrieval.training.catalogue`
    lists it).

    Args:
        item_category: dense category id of each catalogue slot `[C]`.
        clicks: training-target clicks of each slot `[C]`.
        num_categories: size of the category vocabulary.
        depth: how many of the two-tower model's first items it proposes.
        recent: how many of the user's last distinct categories are read.
    """

    def __init__(self, item_category, clicks, num_categories: int, depth: int, recent: int = RECENT_CATEGORIES):
        super().__init__()
        item_category = np.asarray(item_category, np.int64)
        clicks = np.asarray(clicks, np.float64)
        self.size, self.depth, self.recent, self.num_categories = len(item_category), int(depth), recent, num_categories
        order = np.lexsort((np.arange(self.size), -clicks))  # most clicked first; ties by slot
        popularity = np.empty(self.size, np.float32)
        popularity[order] = np.arange(self.size)
        within = np.empty(self.size, np.float32)  # rank among the items of the same category
        by_category = np.lexsort((np.arange(self.size), -clicks, item_category))
        starts = np.searchsorted(item_category[by_category], item_category[by_category])
        within[by_category] = np.arange(self.size) - starts
        self.item_category = tf.constant(item_category)
        self.popularity_rank = tf.constant(popularity)
        self.category_rank = tf.constant(within)

    def ranks(self, tower_scores, hist_items, hist_categories) -> list:
        """Each source's rank of every slot `[B, C]` (float32, inf where the source
        does not propose the slot), in `SOURCES` order. `hist_*`: dense ids `[B, L]`,
        0 = padding, oldest first."""
        inf = tf.constant(np.inf, tf.float32)
        batch = tf.shape(tower_scores)[0]
        depth = tf.minimum(self.depth, self.size)
        top = tf.math.top_k(tower_scores, k=depth).indices
        rows = tf.repeat(tf.range(batch)[:, None], depth, axis=1)
        tower = tf.tensor_scatter_nd_update(tf.fill([batch, self.size], inf), tf.stack([rows, top], -1),
                                            tf.tile(tf.range(depth, dtype=tf.float32)[None], [batch, 1]))
        popularity = tf.tile(self.popularity_rank[None], [batch, 1])
        # The last position of each category in each history (-1: absent), then each
        # category's recency rank (0 = the most recent category).
        length = tf.shape(hist_categories)[1]
        position = tf.where(hist_items > 0, tf.range(length, dtype=tf.int32)[None], -1)
        segment = tf.cast(hist_categories, tf.int32) + tf.range(batch)[:, None] * self.num_categories
        last = tf.math.unsorted_segment_max(tf.reshape(position, [-1]), tf.reshape(segment, [-1]),
                                            batch * self.num_categories)
        last = tf.maximum(tf.reshape(last, [batch, self.num_categories]), -1)  # (empty segments: int min)
        last = tf.concat([tf.fill([batch, 1], -1), last[:, 1:]], axis=1)  # category 0 is padding
        recency = tf.argsort(tf.argsort(-last, axis=1, stable=True), axis=1, stable=True)
        recent = (last >= 0) & (recency < self.recent)
        item_recency = tf.gather(recency, self.item_category, axis=1)
        item_recent = tf.gather(recent, self.item_category, axis=1)
        by_category = self.category_rank[None] * self.recent + tf.cast(item_recency, tf.float32)
        return [tower, popularity, tf.where(item_recent, by_category, inf)]

    def seen(self, hist_items):
        """Whether each slot `[B, C]` is among the user's clicks (dense `hist_items` `[B, L]`)."""
        batch, length = tf.shape(hist_items)[0], tf.shape(hist_items)[1]
        slot = tf.cast(hist_items, tf.int32) - 1
        valid = (slot >= 0) & (slot < self.size)
        rows = tf.repeat(tf.range(batch)[:, None], length, axis=1)
        index = tf.boolean_mask(tf.stack([rows, slot], -1), valid)
        return tf.tensor_scatter_nd_update(tf.zeros([batch, self.size], tf.bool), index,
                                           tf.ones([tf.shape(index)[0]], tf.bool))

    def merge(self, ranks: list, quotas, seen, n: int):
        """The first `n` slots `[B, n]` (int32) of the merged order (see the module),
        `seen` ones excluded (None: none)."""
        inf = tf.constant(np.inf, tf.float32)
        key = tf.fill(tf.shape(ranks[0]), inf)
        for rank, quota in zip(ranks, quotas):
            if float(quota) > 0:
                key = tf.minimum(key, (rank + 1.0) / float(quota))
        if seen is not None:
            key = tf.where(seen, inf, key)
        return tf.math.top_k(-key, k=n).indices


def evaluate_sources(merger: CandidateMerger, tower_scores_fn, examples: dict, quota_choices, ks,
                     include_seen: bool = False, batch_size: int = 256) -> dict:
    """Recall@k of the positives `examples` (dense `hist_items`, `hist_categories`,
    `target_item`) for each quota triple of `quota_choices`: `{quotas: {"recall@k":
    ...}}`. `tower_scores_fn(hist_items, hist_categories)` gives `[B, C]` scores."""
    n = max(ks)
    hits = {tuple(q): np.zeros(len(ks)) for q in quota_choices}
    count = len(examples["target_item"])
    for start in range(0, count, batch_size):
        items = examples["hist_items"][start: start + batch_size].astype(np.int32)
        cats = examples["hist_categories"][start: start + batch_size].astype(np.int32)
        target = examples["target_item"][start: start + batch_size].astype(np.int64) - 1
        ranks = merger.ranks(tower_scores_fn(items, cats), items, cats)
        seen = None if include_seen else merger.seen(items)
        for q in hits:
            top = merger.merge(ranks, q, seen, n).numpy()
            found = top == target[:, None]
            position = np.where(found.any(axis=1), found.argmax(axis=1), n)
            hits[q] += [(position < k).sum() for k in ks]
    return {q: {f"recall@{k}": float(h / max(count, 1)) for k, h in zip(ks, hit)} for q, hit in hits.items()}


def one_source(name: str) -> tuple[float, ...]:
    """The quotas of one source alone."""
    return tuple(float(s == name) for s in SOURCES)
