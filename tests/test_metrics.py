import numpy as np
import pytest

from dare_tf import metrics


def brute_auc(y, p):
    pos, neg = p[y == 1], p[y == 0]
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def brute_grouped(y, p, g):
    num = den = 0.0
    for key in set(g.tolist()):
        sel = g == key
        if 0 < y[sel].sum() < sel.sum():
            num += brute_auc(y[sel], p[sel]) * sel.sum()
            den += sel.sum()
    return num / den


def test_metrics_match_brute_force_with_ties(rng):
    for trial in range(5):
        n = 300
        y = rng.integers(0, 2, n)
        p = np.round(rng.random(n), 1)  # heavy ties
        p[:20] = 0.0
        p[20:40] = 1.0
        users = rng.integers(0, 25, n)
        cats = rng.integers(0, 7, n)
        got = metrics.evaluate(y, p, users, cats)
        assert got["auc"] == pytest.approx(brute_auc(y, p), abs=1e-12)
        assert got["gauc"] == pytest.approx(brute_grouped(y, p, users), abs=1e-12)
        assert got["category_auc"] == pytest.approx(brute_grouped(y, p, cats), abs=1e-12)
        clipped = np.clip(p, 1e-7, 1 - 1e-7)
        ref = -np.mean([np.log(c) if t else np.log(1 - c) for t, c in zip(y, clipped)])
        assert got["logloss"] == pytest.approx(ref, rel=1e-12)


def test_degenerate_cases():
    assert np.isnan(metrics.auc([1, 1], [0.2, 0.3]))
    assert metrics.auc([0, 1], [0.5, 0.5]) == 0.5
    assert metrics.auc([0, 1], [0.1, 0.9]) == 1.0
    # Groups with one class are skipped; all-skipped gives NaN.
    assert np.isnan(metrics.grouped_auc([1, 0], [0.1, 0.2], [1, 2]))


def test_hit_rate_and_ndcg_by_hand():
    from dare_tf.metrics import hit_rate_and_ndcg

    # positions 0, 2, 10 (outside k=10) and absent
    hit, ndcg = hit_rate_and_ndcg([0, 2, 10, -1], 10)
    assert hit == 0.5
    assert ndcg == pytest.approx((1.0 + 1.0 / np.log2(4)) / 4)
    assert hit_rate_and_ndcg([10], 11) == pytest.approx((1.0, 1.0 / np.log2(12)))


def test_per_query_hits_and_their_standard_error():
    from dare_tf.metrics import hits_and_gains, standard_error

    hit, gain = hits_and_gains([0, 2, 10, -1], 10)
    np.testing.assert_array_equal(hit, [1, 1, 0, 0])
    np.testing.assert_allclose(gain, [1.0, 1.0 / np.log2(4), 0.0, 0.0])
    # the sample standard deviation over sqrt(n), by hand
    assert standard_error([1, 1, 0, 0]) == pytest.approx(np.sqrt(((0.5**2) * 4) / 3) / 2)
    assert np.isnan(standard_error([1.0]))
