"""dare_tf.data.generation.truth: the planted truth's statistics against brute force."""

import math

import numpy as np

from dare_tf.data.generation.truth import mutual_information, next_category_probability


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
    # (few categories are counted in a table, many sorted: the same pairs in the same order, the same value)
    assert mutual_information(a, related, 6) == mutual_information(a, related, 10**6)
    # a catalogue's worth of categories (Taobao's 9,439 and more): the pairs that occur, not n * n cells
    wide = rng.integers(0, 50_000, 400)
    near = np.where(rng.random(400) < 0.5, wide, rng.integers(0, 50_000, 400))
    assert math.isclose(mutual_information(wide, near, 50_000), _brute_force(wide, near, 50_000), rel_tol=1e-9)


def test_next_category_probabilities_as_the_dense_distribution():
    """The generator's P(next category) of a user in a session, row by row, equals
    the whole distribution built category by category (brute force)."""
    from dare_tf.data.generation.synthetic import SyntheticConfig, _World

    cfg = SyntheticConfig(users=6, items=300, categories=20)
    world = _World(cfg, np.random.default_rng(0))
    rng = np.random.default_rng(3)
    users, sessions, cats = rng.integers(0, 6, 500), rng.integers(0, 20, 500), rng.integers(0, 20, 500)
    got = next_category_probability(cfg, world.cat_p, world.related, world.interests[users], sessions, cats)
    for u, s, c, p in zip(users.tolist(), sessions.tolist(), cats.tolist(), got.tolist()):
        dense = (1 - cfg.p_session) * (1 - cfg.p_interest - cfg.p_related) * world.cat_p
        np.add.at(dense, world.interests[u], (1 - cfg.p_session) * cfg.p_interest / cfg.interests)
        dense[world.related[s]] += (1 - cfg.p_session) * cfg.p_related
        dense[s] += cfg.p_session
        assert p == dense[c]
    whole = next_category_probability(cfg, world.cat_p, world.related, world.interests[np.full(20, 1)], np.full(20, 3),
                                      np.arange(20))
    assert abs(whole.sum() - 1) < 1e-12
