"""dare_tf.data.logs.clicks: a log's rows once read, renumbered and reordered,
against plain-Python references."""

import numpy as np

from dare_tf.data.logs.clicks import Clicks, dense_ids, in_time_order, own_values, time_sorted
from dare_tf.data.logs.formats import ACTION_FIELD


def _clicks(rng, n=200, **extra):
    return Clicks(user=rng.integers(0, 9, n), item=rng.integers(0, 30, n), category=rng.integers(0, 5, n),
                  time=rng.integers(0, 50, n), rows=n, bad_lines=0, sha256="", **extra)


def test_dense_ids_number_in_order_of_first_appearance():
    raw = np.array([70, 5, 70, 9, 5, 1])
    dense, raw_of = dense_ids(raw)
    first = list(dict.fromkeys(raw.tolist()))
    assert dense.tolist() == [first.index(r) + 1 for r in raw.tolist()]
    assert raw_of.tolist() == first


def test_time_sorted_keeps_users_in_first_row_order_and_sorts_each_stably():
    rng = np.random.default_rng(0)
    clicks = _clicks(rng, label=rng.integers(0, 2, 200), fields={"brand": rng.integers(0, 4, 200)})
    users = list(dict.fromkeys(clicks.user.tolist()))
    expected = sorted(range(200), key=lambda i: (users.index(clicks.user[i]), clicks.time[i], i))
    out = time_sorted(clicks)
    for name in ("user", "item", "category", "time", "label"):
        assert getattr(out, name).tolist() == getattr(clicks, name)[expected].tolist()
    assert out.fields["brand"].tolist() == clicks.fields["brand"][expected].tolist()


def test_in_time_order_breaks_ties_by_file_order():
    rng = np.random.default_rng(1)
    clicks = _clicks(rng)
    expected = sorted(range(200), key=lambda i: (clicks.time[i], i))
    assert in_time_order(clicks).item.tolist() == clicks.item[expected].tolist()


def test_empty_field_cells_become_the_items_own_value_and_actions_mark_clicks():
    assert own_values(np.array([3, -1, 0]), np.array([10, 11, 12])).tolist() == [3, -12, 0]
    rng = np.random.default_rng(2)
    actions = _clicks(rng, n=4, fields={ACTION_FIELD: np.array([0, 2, 2, 1])}, click_code=2)
    assert actions.clicked().tolist() == [False, True, True, False]
    assert _clicks(rng, n=3, label=np.array([1, 0, 1])).clicked().tolist() == [True, False, True]
    assert _clicks(rng, n=2).clicked().tolist() == [True, True]
