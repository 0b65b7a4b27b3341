"""The catalogue as of a day, for the time split (`dare_tf.data.preparation.days`):
every item's click count, category and further fields' values up to the end of a
day (`Catalogue`), and what a day's negatives are drawn from (`ClicksToDate`);
the Beam driver's per-day reductions of it (`day_item_summaries`,
`merge_day_items`, `clicks_by_day`)."""

from __future__ import annotations

import dataclasses
import datetime

import numpy as np

from dare_tf.data.logs.times import DAY
from dare_tf.data.preparation.examples import MAX_NEGATIVE_ROUNDS
from dare_tf.data.storage.fields import last_rows


def day_name(day: int) -> str:
    """`2017-12-03` for the day number (days since the epoch)."""
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=int(day))).isoformat()


@dataclasses.dataclass
class ClicksToDate:
    """Every click up to the end of a day, by item: the negatives of the day's
    examples are drawn from them in proportion to their counts.

    Attributes:
        day: days since the epoch.
        items: the dense ids clicked up to the end of the day, ascending.
        cdf: cumulative click counts of `items`.
        categories: each of `items`' category as of that day (its last row up to then).
        fields: each further field's values of `items`, as `categories`.
    """

    day: int
    items: np.ndarray
    cdf: np.ndarray
    categories: np.ndarray
    fields: dict = dataclasses.field(default_factory=dict)

    def category_of(self, items: np.ndarray) -> np.ndarray:
        return self.categories[np.searchsorted(self.items, items)]

    def field_of(self, name: str):
        """`items -> their values` of field `name` as of the day."""
        return lambda items: self.fields[name][np.searchsorted(self.items, items)]

    def draw(self, n: int, clicked: np.ndarray, rng, uid: int) -> np.ndarray:
        """`n` items by their click counts, none in `clicked` (sorted, unique)."""
        out = np.zeros(n, np.int64)
        if n == 0:
            return out
        if np.isin(self.items, clicked, assume_unique=True).all():
            raise ValueError(f"user with dense id {uid} clicked every item clicked up to {day_name(self.day)}, so "
                             "no negative can be drawn for it")
        filled, total = 0, int(self.cdf[-1])
        for _ in range(MAX_NEGATIVE_ROUNDS):
            cand = self.items[np.searchsorted(self.cdf, rng.random(int((n - filled) * 1.25) + 4) * total, "right")]
            cand = cand[~np.isin(cand, clicked)][: n - filled]
            out[filled: filled + len(cand)] = cand
            filled += len(cand)
            if filled == n:
                return out
        raise RuntimeError(f"could not draw {n} negatives for user with dense id {uid} on {day_name(self.day)} "
                           f"after {MAX_NEGATIVE_ROUNDS} rounds: it clicked nearly every frequent item")


class Catalogue:
    """The items' click counts, categories and further fields' values (dense,
    `[num_items]`) as of the end of the last day it was advanced over: zeros
    before a log's first day, the dataset's `ITEM_CLICKS_FILE`,
    `ITEM_CATEGORY_FILE` (and `item_<field>.txt`) before an appended one."""

    def __init__(self, counts: np.ndarray, categories: np.ndarray, fields: dict | None = None):
        self.counts, self.categories = np.asarray(counts, np.int64).copy(), np.asarray(categories, np.int64).copy()
        self.fields = {k: np.asarray(v, np.int64).copy() for k, v in (fields or {}).items()}

    def advance(self, day: int, items, categories, clicks, fields: dict | None = None) -> ClicksToDate:
        """Adds a day: its rows' dense `items` and `categories` (and `fields`' values)
        in time order (`clicks`: where a row is a click), each item keeping its last
        row's values."""
        items, categories = np.asarray(items, np.int64), np.asarray(categories, np.int64)
        self.counts += np.bincount(items[clicks], minlength=len(self.counts))
        last = last_rows(items)
        self.categories[items[last]] = categories[last]
        for name, values in (fields or {}).items():
            self.fields[name][items[last]] = np.asarray(values)[last]
        return self.to_date(day)

    def advance_by(self, day: int, entries) -> ClicksToDate:
        """`advance` from a day's `(item, clicks, last category, last fields' values)` entries."""
        for item, count, category, values in entries:
            self.counts[item] += count
            self.categories[item] = category
            for name, value in zip(self.fields, values):
                self.fields[name][item] = value
        return self.to_date(day)

    def to_date(self, day: int) -> ClicksToDate:
        items = np.flatnonzero(self.counts)
        return ClicksToDate(int(day), items, np.cumsum(self.counts[items]), self.categories[items].copy(),
                            {k: v[items].copy() for k, v in self.fields.items()})


def day_item_summaries(items, categories, times, keys, labels, fields):
    """`((day, item), (clicks, last (time, key), category and further fields'
    values (`fields`, `[rows, F]`) at the last row))` of one user's rows (raw
    ids), merged over users by `merge_day_items` and stepped through by
    `clicks_by_day`."""
    by = {}
    for i in range(len(items)):
        k = (int(times[i]) // DAY, int(items[i]))
        count, last, category, values = by.get(k, (0, None, None, None))
        at = (int(times[i]), int(keys[i]))
        count += int(labels[i] == 1)
        by[k] = ((count, at, int(categories[i]), tuple(fields[i].tolist())) if last is None or at >= last
                 else (count, last, category, values))
    return list(by.items())


def merge_day_items(values):
    values = list(values)
    last = max(values, key=lambda v: v[1])
    return sum(v[0] for v in values), last[1], last[2], last[3]


def clicks_by_day(summaries, side: dict) -> dict[int, ClicksToDate]:
    """`{day: ClicksToDate}` of every day of the merged summaries (raw ids; `side`:
    the Beam driver's statistics, whose maps give the dense ids)."""
    days: dict[int, list] = {}
    dense = side["field_dense"]
    for (day, raw_item), (count, _, raw_category, raw_values) in summaries:
        days.setdefault(day, []).append((side["item_dense"][raw_item], count, side["category_dense"][raw_category],
                                         tuple(dense[j][v] for j, v in enumerate(raw_values))))
    num_items = side["stats"].num_items
    catalogue = Catalogue(np.zeros(num_items, np.int64), np.zeros(num_items, np.int64),
                          {n: np.zeros(num_items, np.int64) for n in side["field_names"]})
    return {day: catalogue.advance_by(day, days[day]) for day in sorted(days)}
