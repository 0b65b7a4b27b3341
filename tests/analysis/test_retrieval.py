"""The retrieval analyses: mutual information, NDCG, planted gains."""

import numpy as np
import pytest

from dare_tf.analysis import attention, retrieval


def test_mutual_information_matches_a_brute_force_count(rng):
    from sklearn.metrics import mutual_info_score

    n, length, cats = 400, 6, 4
    tc = rng.integers(1, cats, n)
    hc = rng.integers(0, cats, (n, length))
    # The label depends on "target's category at position 1", so some cells carry information.
    y = ((hc[:, -1] == tc) | (rng.random(n) < 0.3)).astype(float)
    counts = attention.CooccurrenceCounts.from_examples(tc, hc, y, cats)
    # Counted in chunks of 7 examples (merged across chunks), the same counts.
    chunked = attention.CooccurrenceCounts.from_examples(tc, hc, y, cats, chunk=7)
    for name in ("keys", "positives", "negatives", "target_positives", "target_negatives"):
        np.testing.assert_array_equal(getattr(chunked, name), getattr(counts, name))
    checked = 0
    for t in range(1, cats):
        rows = tc == t
        for c in range(1, cats):
            for p in range(1, length + 1):
                present = hc[rows, length - p] == c
                x_pos = int((present & (y[rows] == 1)).sum())
                x_neg = int((present & (y[rows] == 0)).sum())
                assert counts.lookup(t, c, p) == (x_pos, x_neg)
                # (A zero count is smoothed to 1e-5 as in the paper's analysis; compare the rest.)
                if x_pos and x_neg and present.sum() < rows.sum():
                    expected = mutual_info_score(y[rows], present) / np.log(2)  # bits
                    assert counts.mutual_information(t, c, p) == pytest.approx(expected, abs=1e-9)
                    checked += 1
    assert checked > 50
    assert counts.target_positives[1] == int(y[tc == 1].sum())
    # Vectorised over broadcast index arrays, the same numbers.
    grid = counts.mutual_information(np.array([1, 2])[:, None, None], np.arange(1, cats)[None, :, None],
                                     np.arange(1, length + 1)[None, None, :])
    assert grid.shape == (2, cats - 1, length)
    assert grid[1, 0, 2] == pytest.approx(counts.mutual_information(2, 1, 3))


def test_ndcg_against_a_hand_computed_case():
    gains = np.array([[3.0, 2.0, 0.0, 1.0, 5.0]])
    scores = np.array([[0.9, 0.1, 0.8, 0.5, 0.0]])
    valid = np.array([[True, True, True, True, False]])  # the 5.0 slot is padding: never counted
    # Ranked by score: slots 0 (3), 2 (0), 3 (1); ideal: 3, 2, 1.
    dcg = 3 / np.log2(2) + 0 / np.log2(3) + 1 / np.log2(4)
    idcg = 3 / np.log2(2) + 2 / np.log2(3) + 1 / np.log2(4)
    assert retrieval.ndcg_at_k(gains, scores, valid, 3)[0] == pytest.approx(dcg / idcg)
    # The perfect ranking gives 1; no gain at all gives NaN (left out of means).
    assert retrieval.ndcg_at_k(gains, gains, valid, 3)[0] == pytest.approx(1.0)
    assert np.isnan(retrieval.ndcg_at_k(np.zeros((1, 5)), scores, valid, 3)[0])
    summary = retrieval.mean_with_interval(np.array([0.5, np.nan, 0.7]))
    assert summary["count"] == 2 and summary["mean"] == pytest.approx(0.6)


def test_planted_gains_follow_the_generator_truth():
    truth = {"per_lag": [{"lag": 1, "p_same_category": 0.6, "p_related_category": 0.1},
                         {"lag": 2, "p_same_category": 0.4, "p_related_category": 0.05}],
             "related_category": [0, 2, 1, 4, 3]}
    gains = retrieval.planted_gains(truth, [1, 3], [[2, 1], [0, 3]])
    # Target 1: slot 0 (lag 2) holds its related category 2, slot 1 (lag 1) the same category.
    np.testing.assert_allclose(gains, [[0.05, 0.6], [0.0, 0.6]])


def test_the_papers_population_against_a_per_example_count(rng):
    """Kept: a target category with >= 700 training examples, and at most 20 * L / 200
    behaviours in cells of fewer than 50 positives or 50 negatives (brute force)."""
    from dare_tf.analysis.attention import CooccurrenceCounts
    from dare_tf.analysis.retrieval import paper_population

    n, length, categories = 6000, 40, 10
    tc = rng.choice(np.arange(1, 6), n, p=[0.5, 0.3, 0.1, 0.05, 0.05])  # two targets with >= 700 examples
    behaviour = rng.choice(np.arange(1, categories), (n, length), p=[0.3, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01])
    hc = np.where(rng.random((n, length)) < 0.2, 0, behaviour)  # rare behaviour categories: thin cells
    labels = rng.random(n) < 0.5
    counts = CooccurrenceCounts.from_examples(tc, hc, labels, categories)
    test_tc, test_hc = tc[:200], hc[:200]
    keep, population = paper_population(counts, test_tc, test_hc)
    expected = []
    for t, history in zip(test_tc, test_hc):
        thin = 0
        for slot, c in enumerate(history):
            if c > 0:
                position = length - slot
                rows = (tc == t) & (hc[:, slot] == c)
                thin += int(labels[rows].sum() < 50 or (~labels[rows]).sum() < 50)
        expected.append((tc == t).sum() >= 700 and thin <= round(20 * length / 200) and (history > 0).any())
        assert position >= 1
    assert keep.tolist() == expected and population["kept"] == sum(expected) and population["max_thin"] == 4
    assert 0 < population["kept"] < 200 and population["frequent_target"] > population["kept"]
