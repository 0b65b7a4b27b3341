"""Multi-source candidates against a per-user numpy reference (TensorFlow only: no
tensorflow-recommenders, so these run in the suite's own process)."""

import numpy as np
import pytest

from dare_tf.retrieval.candidates import (BLOCKED_FROM, ORIGINS, SOURCES, CandidateMerger, PopularitySource, Query,
                                         RecentCategorySource, TwoTowerSource, blocked_top_k, one_source, quota_grid,
                                         quota_key)
from dare_tf.retrieval.evaluation import evaluate_sources, score_rows


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
    key, origin = np.full(size, np.inf), np.full(size, ORIGINS.index("filler"))
    for name in SOURCES:  # (equal keys: the first source placed it)
        if quotas[name] > 0:
            mine = (ranks[name] + 1) / quotas[name]
            origin[mine < key] = ORIGINS.index(name)
            key = np.minimum(key, mine)
    clicked = np.zeros(size, bool)
    if not include_seen:
        clicked[[i - 1 for i in hist_items if 0 < i <= size]] = True
        key[clicked] = np.inf
        origin[clicked] = ORIGINS.index("seen")
    slots = np.lexsort((np.arange(size), key, clicked))[:n]  # the user's own items after every other
    return slots, origin[slots]


@pytest.mark.parametrize("include_seen", [False, True])
@pytest.mark.parametrize("n", [15, 50])  # 50: fewer proposals than n, the rest filled by slot
def test_merged_candidates_match_the_reference(rng, include_seen, n):
    size, num_categories, length, depth, recent = 60, 9, 12, 10, 3
    item_category = rng.integers(1, num_categories, size)
    clicks = rng.integers(0, 5, size).astype(float)  # ties, broken by slot
    merger = CandidateMerger(item_category, clicks, num_categories, depth=depth, recent=recent)
    scores = rng.normal(size=(5, size)).astype(np.float32)
    hist_items = rng.integers(1, size + 1, (5, length))
    hist_items[0, :7] = 0  # left padding
    hist_items[1] = 0  # an empty history: no recent categories, nothing seen
    hist_categories = np.where(hist_items > 0, item_category[np.maximum(hist_items - 1, 0)], 0)
    hist_items, hist_categories = hist_items.astype(np.int32), hist_categories.astype(np.int32)
    proposals = merger.proposals(Query(scores, hist_items, hist_categories), n)
    for shares in [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.25, 0.25), (0.25, 0.5, 0.25)]:
        quotas = dict(zip(SOURCES, shares))
        got = merger.merge(proposals, quotas, hist_items, n, include_seen).numpy()
        slots, origins = (t.numpy() for t in merger.merge(proposals, quotas, hist_items, n, include_seen, True))
        np.testing.assert_array_equal(slots, got)
        for b in range(5):
            expected, placed_by = _reference(scores[b], hist_items[b], hist_categories[b], item_category, clicks,
                                             quotas, n, depth, recent, include_seen)
            np.testing.assert_array_equal(got[b], expected, err_msg=f"{quotas}, user {b}")
            np.testing.assert_array_equal(origins[b], placed_by, err_msg=f"{quotas}, user {b}")


def test_each_source_proposes_its_first_k_without_ranking_the_catalogue(rng):
    item_category = np.array([1, 2, 1, 3, 1, 2])
    clicks = np.array([0, 5, 2, 2, 9, 1], float)
    hist_items = np.array([[0, 2, 5], [0, 0, 0]], np.int32)  # user 0: categories 2 then 1 (most recent)
    hist_categories = np.array([[0, 2, 1], [0, 0, 0]], np.int32)
    scores = np.array([[0.1, 0.9, 0.5, 0.5, -1.0, 0.0]] * 2, np.float32)
    query = Query(scores, hist_items, hist_categories)
    slots, ranks = (t.numpy() for t in TwoTowerSource(depth=3).top_k(query, 5))
    assert slots[0].tolist() == [1, 2, 3, -1, -1] and ranks[0].tolist() == [0, 1, 2, np.inf, np.inf]
    slots, ranks = (t.numpy() for t in PopularitySource(clicks).top_k(query, 4))
    assert slots.tolist() == [[4, 1, 2, 3]] * 2 and ranks[1].tolist() == [0, 1, 2, 3]  # ties by slot
    source = RecentCategorySource(item_category, clicks, num_categories=4, recent=2)
    slots, ranks = (t.numpy() for t in source.top_k(query, 5))
    # category 1 (recency 0): slots 4, 2, 0 by clicks; category 2 (recency 1): slots 1, 5
    assert slots[0].tolist() == [4, 1, 2, 5, 0] and ranks[0].tolist() == [0, 1, 2, 3, 4]
    assert slots[1].tolist() == [-1] * 5  # an empty history: no recent category
    with pytest.raises(ValueError, match=r"^quotas of unknown sources \['trending'\]; the sources: "):
        CandidateMerger(item_category, clicks, 4, depth=3).merge(
            {}, {"trending": 1.0}, hist_items, 2)


@pytest.mark.parametrize("size, keep, k", [(BLOCKED_FROM + 17, 400, 400), (BLOCKED_FROM + 17, 400, 37),
                                           (1000, 7, 7), (10, 3, 2)])
def test_a_top_k_by_blocks_is_the_top_k(rng, size, keep, k):
    """Against tf.math.top_k: the same indices in the same order for distinct scores;
    with ties, the same scores (the best concentrated in few blocks, the worst case)."""
    import tensorflow as tf

    scores = rng.normal(size=(5, size)).astype(np.float32)
    scores[1, : 3 * keep] += 10  # every best one in the first blocks
    scores[2, -(k + 1):] += 10  # ...in the last, padded block
    got = blocked_top_k(tf.constant(scores), k, keep).numpy()
    np.testing.assert_array_equal(got, tf.math.top_k(scores, k=k).indices.numpy())
    tied = np.round(scores, 1)
    got = blocked_top_k(tf.constant(tied), k, keep).numpy()
    expected = tf.math.top_k(tied, k=k).values.numpy()
    np.testing.assert_array_equal(np.take_along_axis(tied, got, axis=1), expected)
    assert all(len(set(row)) == k for row in got)


def test_the_two_tower_source_of_a_large_catalogue_is_the_exact_top_k(rng):
    import tensorflow as tf

    scores = rng.normal(size=(3, BLOCKED_FROM)).astype(np.float32)
    query = Query(tf.constant(scores), np.zeros((3, 4), np.int32), np.zeros((3, 4), np.int32))
    slots, ranks = (t.numpy() for t in TwoTowerSource(depth=300).top_k(query, 250))
    np.testing.assert_array_equal(slots, np.argsort(-scores, axis=1, kind="stable")[:, :250])


def test_recall_of_each_source_and_the_grid(rng, monkeypatch):
    assert quota_grid()[:3] == [one_source(s) for s in SOURCES]
    assert len(quota_grid()) == 15 and all(abs(sum(q.values()) - 1) < 1e-9 for q in quota_grid())
    size, num_categories = 40, 5
    item_category = np.arange(size) % (num_categories - 1) + 1
    clicks = np.arange(size, 0, -1).astype(float)  # slot 0 the most popular
    merger = CandidateMerger(item_category, clicks, num_categories, depth=5)
    examples = {"hist_items": np.array([[0, 3], [0, 7]]), "hist_categories": np.array([[0, item_category[2]],
                                                                                     [0, item_category[6]]]),
                "target_item": np.array([1, 40])}  # dense ids: slot 0 (popular) and slot 39 (not)
    scores = lambda items, cats: np.tile(np.arange(size, dtype=np.float32), (len(items), 1))  # noqa: E731
    out = evaluate_sources(merger, scores, examples, [one_source("popularity"), one_source("two_tower"),
                                                      one_source("popularity")], [1, 2])  # (listed twice)
    assert out[quota_key(one_source("popularity"))] == {"recall@1": 0.5, "recall@2": 0.5}
    assert out[quota_key(one_source("two_tower"))] == {"recall@1": 0.5, "recall@2": 0.5}  # slot 39 scores highest
    # At millions of items a batch of scores is capped (256 rows of 4.16M would be 4 GB): the same recall.
    assert score_rows(4_162_024, 256) == 32 and score_rows(50_000, 256) == 256 and score_rows(10**9, 256) == 1
    import dare_tf.retrieval.evaluation as evaluation

    shapes = []
    capped = lambda items, cats: shapes.append(len(items)) or scores(items, cats)  # noqa: E731
    monkeypatch.setattr(evaluation, "SCORES_PER_BATCH", size)  # one history per batch
    assert evaluate_sources(merger, capped, examples, [one_source("popularity"), one_source("two_tower")],
                            [1, 2]) == {k: v for k, v in out.items()} and shapes == [1, 1]
