"""Multi-source candidates against a per-user numpy reference (TensorFlow only: no
tensorflow-recommenders, so these run in the suite's own process)."""

import numpy as np
import pytest

from dare_tf.retrieval.candidates import SOURCES, CandidateMerger, evaluate_sources, one_source, quota_grid


def _reference(scores, hist_items, hist_categories, item_category, clicks, quotas, n, depth, recent, include_seen):
    """The merged first `n` slots of one user, written out as the module describes it."""
    size = len(item_category)
    ranks = {name: np.full(size, np.inf) for name in SOURCES}
    ranks["two_tower"][np.lexsort((np.arange(size), -scores))[:depth]] = np.arange(min(depth, size))
    ranks["popularity"][np.lexsort((np.arange(size), -clicks))] = np.arange(size)
    latest = []  # the last `recent` distinct categories, most recent first
    for item, category in zip(hist_items[::-1], hist_categories[::-1]):
        if item > 0 and category not in latest:
            latest.append(category)
    for j, category in enumerate(latest[:recent]):
        members = np.flatnonzero(item_category == category)
        members = members[np.lexsort((members, -clicks[members]))]
        ranks["recent_categories"][members] = np.arange(len(members)) * recent + j
    key = np.full(size, np.inf)
    for name, quota in zip(SOURCES, quotas):
        if quota > 0:
            key = np.minimum(key, (ranks[name] + 1) / quota)
    if not include_seen:
        key[[i - 1 for i in hist_items if 0 < i <= size]] = np.inf
    return np.lexsort((np.arange(size), key))[:n]


@pytest.mark.parametrize("include_seen", [False, True])
def test_merged_candidates_match_the_reference(rng, include_seen):
    size, num_categories, length, n, depth, recent = 60, 9, 12, 15, 10, 3
    item_category = rng.integers(1, num_categories, size)
    clicks = rng.integers(0, 5, size).astype(float)  # ties, broken by slot
    merger = CandidateMerger(item_category, clicks, num_categories, depth=depth, recent=recent)
    scores = rng.normal(size=(5, size)).astype(np.float32)
    hist_items = rng.integers(1, size + 1, (5, length))
    hist_items[0, :7] = 0  # left padding
    hist_items[1] = 0  # an empty history: no recent categories, nothing seen
    hist_categories = np.where(hist_items > 0, item_category[np.maximum(hist_items - 1, 0)], 0)
    ranks = merger.ranks(scores, hist_items.astype(np.int32), hist_categories.astype(np.int32))
    seen = None if include_seen else merger.seen(hist_items.astype(np.int32))
    for quotas in [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.25, 0.25), (0.25, 0.5, 0.25)]:
        got = merger.merge(ranks, quotas, seen, n).numpy()
        for b in range(5):
            expected = _reference(scores[b], hist_items[b], hist_categories[b], item_category, clicks, quotas, n,
                                  depth, recent, include_seen)
            np.testing.assert_array_equal(got[b], expected, err_msg=f"{quotas}, user {b}")


def test_recall_of_each_source_and_the_grid(rng):
    assert quota_grid()[:3] == [one_source(s) for s in SOURCES]
    assert len(quota_grid()) == 15 and all(abs(sum(q) - 1) < 1e-9 for q in quota_grid())
    size, num_categories = 40, 5
    item_category = np.arange(size) % (num_categories - 1) + 1
    clicks = np.arange(size, 0, -1).astype(float)  # slot 0 the most popular
    merger = CandidateMerger(item_category, clicks, num_categories, depth=5)
    examples = {"hist_items": np.array([[0, 3], [0, 7]]), "hist_categories": np.array([[0, item_category[2]],
                                                                                     [0, item_category[6]]]),
                "target_item": np.array([1, 40])}  # dense ids: slot 0 (popular) and slot 39 (not)
    scores = lambda items, cats: np.tile(np.arange(size, dtype=np.float32), (len(items), 1))  # noqa: E731
    out = evaluate_sources(merger, scores, examples, [one_source("popularity"), one_source("two_tower")], [1, 2])
    assert out[one_source("popularity")] == {"recall@1": 0.5, "recall@2": 0.5}
    assert out[one_source("two_tower")] == {"recall@1": 0.5, "recall@2": 0.5}  # slot 39 scores highest
