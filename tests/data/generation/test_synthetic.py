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
