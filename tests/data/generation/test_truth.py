"""dare_tf.data.generation.truth: the planted truth's statistics against brute force."""

import math

import numpy as np

from dare_tf.data.generation.truth import mutual_information


def _brute_force(a, b, n):
    pairs = list(zip(a.tolist(), b.tolist()))
    total = len(pairs)
    joint = {p: pairs.count(p) / total for p in set(pairs)}
    pa = {x: sum(v for (i, _), v in joint.items() if i == x) for x in set(a.tolist())}
    pb = {y: sum(v for (_, j), v in joint.items() if j == y) for y in set(b.tolist())}
    mi = sum(v * math.log(v / (pa[i] * pb[j])) for (i, j), v in joint.items())
    bias = (len(joint) - len(pa) - len(pb) + 1) / (2 * total)  # Miller-Madow
    return max(mi - bias, 0.0)


def test_mutual_information_against_brute_force():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 6, 500)
    related = (a + rng.integers(0, 2, 500)) % 6
    independent = rng.integers(0, 6, 500)
    for b in (related, independent, a):
        assert math.isclose(mutual_information(a, b, 6), _brute_force(a, b, 6), rel_tol=1e-9, abs_tol=1e-12)
    assert mutual_information(a, a, 6) > mutual_information(a, related, 6) > mutual_information(a, independent, 6)
    # a catalogue's worth of categories (Taobao's 9,439 and more): the pairs that occur, not n * n cells
    wide = rng.integers(0, 50_000, 400)
    near = np.where(rng.random(400) < 0.5, wide, rng.integers(0, 50_000, 400))
    assert math.isclose(mutual_information(wide, near, 50_000), _brute_force(wide, near, 50_000), rel_tol=1e-9)


def test_pairwise_auc_counts_every_pair_as_the_matrix_does():
    from dare_tf.data.generation.truth import pairwise_auc

    rng = np.random.default_rng(1)
    pos, neg = rng.integers(0, 30, 400) / 7, rng.integers(0, 30, 900) / 7  # (many ties)
    matrix = (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()
    assert pairwise_auc(pos, neg) == matrix
    assert pairwise_auc(np.array([2.0]), np.array([1.0, 2.0, 3.0])) == 0.5
