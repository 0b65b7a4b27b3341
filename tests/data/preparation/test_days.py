"""dare_tf.data.preparation.days: the catalogue as of a day, negatives drawn by it against a
numpy recount, a user's examples of one day (qualification on the day, segments
cut at a window's first time inside a day), and its one-line refusal. (Whole
logs: tests/data/preparation/test_examples.py; appending: tests/data/preparation/test_append.py.)"""

import numpy as np
import pytest

from dare_tf.data.logs.times import DAY
from dare_tf.data.preparation.catalogue import Catalogue
from dare_tf.data.preparation.days import user_day_examples
from dare_tf.data.preparation.examples import UserRows
from dare_tf.data.preparation.protocol import Protocol

PROTOCOL = Protocol(split="time", min_clicks=4, negatives=3, partitions=1, seed=7)


def test_the_catalogue_counts_clicks_and_keeps_each_items_last_category():
    catalogue = Catalogue(np.zeros(8, np.int64), np.zeros(8, np.int64))
    catalogue.advance(10, [1, 2, 1, 3], [5, 6, 7, 8], np.array([True, True, True, False]))
    to_date = catalogue.advance(11, [2, 4], [9, 2], np.array([True, True]))
    np.testing.assert_array_equal(to_date.items, [1, 2, 4])  # item 3 was seen, never clicked
    np.testing.assert_array_equal(to_date.cdf, [2, 4, 5])
    np.testing.assert_array_equal(to_date.categories, [7, 9, 2])
    np.testing.assert_array_equal(catalogue.categories[:5], [0, 7, 9, 8, 2])
    assert to_date.day == 11


def test_negatives_follow_the_click_counts_and_skip_what_the_user_clicked():
    counts = np.array([0, 50, 30, 15, 5, 0])
    to_date = Catalogue(counts, np.arange(6)).to_date(3)
    drawn = to_date.draw(40_000, np.array([2]), np.random.default_rng(0), uid=1)
    assert 2 not in drawn
    share = np.bincount(drawn, minlength=6)[[1, 3, 4]] / len(drawn)
    np.testing.assert_allclose(share, np.array([50, 15, 5]) / 70, atol=0.01)
    with pytest.raises(ValueError, match=r"^user with dense id 9 clicked every item clicked up to 1970-01-04, so no "
                                         r"negative can be drawn for it$"):
        to_date.draw(1, np.array([1, 2, 3, 4]), np.random.default_rng(0), uid=9)


def _rows(times, items, labels=None):
    times = np.asarray(times, np.int64)
    return UserRows(items=np.asarray(items, np.int64), categories=np.asarray(items, np.int64) % 3 + 1, times=times,
                    labels=None if labels is None else np.asarray(labels))


def test_a_users_day_qualifies_on_its_clicks_so_far_and_is_cut_at_a_window_inside_it():
    day = 19_000
    to_date = Catalogue(np.r_[0, np.full(30, 4), 0], np.r_[0, np.arange(30) % 5 + 1, 0]).to_date(day)
    start = day * DAY
    rows = _rows([start + 10, start + 20, start + 500, start + 900], [11, 12, 13, 14])
    # One click before the day and four that day reach min_clicks = 4; the window starts at +600.
    bounds = (start + 600, start + 2 * DAY)
    out = user_day_examples(5, np.array([20]), rows, to_date, PROTOCOL, bounds)
    assert sorted(out) == [start, start + 600]
    group = 1 + PROTOCOL.negatives
    train, val = out[start], out[start + 600]
    assert train.shape == (3 * group, 5) and val.shape == (group, 5)
    np.testing.assert_array_equal(train[::group, 1], [1, 2, 3])  # positions: the clicks before
    np.testing.assert_array_equal(train[::group, 2], [11, 12, 13])
    np.testing.assert_array_equal(val[0], [5, 4, 14, 14 % 3 + 1, 1])
    negatives = np.concatenate([train.reshape(3, group, 5)[:, 1:, 2].ravel(), val[1:, 2]])
    assert not set(negatives.tolist()) & {11, 12, 13, 14, 20}
    np.testing.assert_array_equal(val[1:, 3], to_date.category_of(val[1:, 2]))
    # The same user and day draw the same negatives (the stream is (seed, day, user)); too few clicks: none.
    again = user_day_examples(5, np.array([20]), rows, to_date, PROTOCOL, bounds)
    np.testing.assert_array_equal(again[start], train)
    fewer = _rows([start + 10, start + 20], [11, 12])  # 1 + 2 clicks: under min_clicks
    assert user_day_examples(5, np.array([20]), fewer, to_date, PROTOCOL, bounds) == {}


def test_an_impression_day_keeps_every_impression_with_its_label():
    day = 19_000
    to_date = Catalogue(np.zeros(32, np.int64), np.zeros(32, np.int64)).to_date(day)
    start = day * DAY
    rows = _rows([start + 1, start + 2, start + 2, start + 3], [11, 12, 13, 14], labels=[1, 0, 1, 0])
    out = user_day_examples(2, np.array([1, 2, 3]), rows, to_date, PROTOCOL, (start + DAY, start + 2 * DAY))
    np.testing.assert_array_equal(out[start], [[2, 3, 11, 3, 1], [2, 4, 12, 1, 0], [2, 4, 13, 2, 1],
                                               [2, 5, 14, 3, 0]])
