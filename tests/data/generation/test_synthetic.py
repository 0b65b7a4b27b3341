"""dare_tf.data.generation.synthetic's parts against brute force (its logs' planted
structure is tested where it is used: tests/retrieval/test_planted_candidates.py)."""

import numpy as np

from dare_tf.data.generation.synthetic import SyntheticConfig, _World


def test_items_are_drawn_by_popularity_within_each_rows_category():
    """Rows grouped by category once, not one pass over the rows per category
    (9,439 categories x 100M rows): the same draws as row by row."""
    cfg = SyntheticConfig(users=10, items=500, categories=40)
    world = _World(cfg, np.random.default_rng(0))
    cats = np.random.default_rng(1).integers(0, 40, 3000)
    drawn = world.draw_items(cats, np.random.default_rng(2))
    u = np.random.default_rng(2).random(3000)
    expected = [world.cat_items[c][min(int(np.searchsorted(world.cat_cdfs[c], x)), len(world.cat_items[c]) - 1)]
                for c, x in zip(cats.tolist(), u.tolist())]
    assert drawn.tolist() == expected
    assert (world.item_cat[drawn] == cats).all()


def test_next_category_probabilities_as_the_dense_distribution():
    """The generator's P(next category) of a user in a session, row by row, equals
    the whole distribution built category by category (brute force)."""
    cfg = SyntheticConfig(users=6, items=300, categories=20)
    world = _World(cfg, np.random.default_rng(0))
    rng = np.random.default_rng(3)
    users, sessions, cats = rng.integers(0, 6, 500), rng.integers(0, 20, 500), rng.integers(0, 20, 500)
    got = world.category_probs(sessions, users, cats)
    for u, s, c, p in zip(users.tolist(), sessions.tolist(), cats.tolist(), got.tolist()):
        dense = (1 - cfg.p_session) * (1 - cfg.p_interest - cfg.p_related) * world.cat_p
        np.add.at(dense, world.interests[u], (1 - cfg.p_session) * cfg.p_interest / cfg.interests)
        dense[world.related[s]] += (1 - cfg.p_session) * cfg.p_related
        dense[s] += cfg.p_session
        assert p == dense[c]
    whole = world.category_probs(np.full(20, 3), np.full(20, 1), np.arange(20))
    assert abs(whole.sum() - 1) < 1e-12
