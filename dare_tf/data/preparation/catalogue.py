"""The catalogue as of a day, for the time split (`dare_tf.data.preparation.days`):
every item's click count, category and further fields' values up to the end of a
day (`Catalogue`), and what a day's negatives are drawn from (`ClicksToDate`);
and every day's `ClicksToDate` from the Beam driver's per-day summaries
(`clicks_by_day`)."""

from __future__ import annotations

import dataclasses
import datetime

import numpy as np

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

    def advance_by(self, day: int, items, counts, categories, fields: dict | None = None) -> ClicksToDate:
        """`advance` from a day's distinct dense `items`: their click counts that day,
        and their category and fields' values at their last row that day."""
        self.counts[items] += counts
        self.categories[items] = categories
        for name, values in (fields or {}).items():
            self.fields[name][items] = values
        return self.to_date(day)

    def to_date(self, day: int) -> ClicksToDate:
        items = np.flatnonzero(self.counts)
        return ClicksToDate(int(day), items, np.cumsum(self.counts[items]), self.categories[items].copy(),
                            {k: v[items].copy() for k, v in self.fields.items()})


def clicks_by_day(merged: dict, side: dict) -> dict[int, ClicksToDate]:
    """`{day: ClicksToDate}` of every day of the Beam driver's merged day summaries
    (`beam_statistics.day_summaries`, `{}` for a log without rows: raw ids;
    `side`: its statistics, whose tables give the dense ids)."""
    from dare_tf.data.preparation.beam_statistics import dense_of

    if not merged:
        return {}
    days = merged["days"]
    day, raw_item = days["ids"][:, 0], days["ids"][:, 1]
    items, categories = dense_of(side["items"], raw_item), dense_of(side["categories"], days["carry"][:, 0])
    fields = {name: dense_of(side["fields"][j], days["carry"][:, 1 + j]) for j, name in enumerate(side["field_names"])}
    num_items = side["stats"].num_items
    catalogue = Catalogue(np.zeros(num_items, np.int64), np.zeros(num_items, np.int64),
                          {n: np.zeros(num_items, np.int64) for n in side["field_names"]})
    out = {}
    for d in np.unique(day).tolist():  # (the summary is sorted by day, then item)
        at = slice(np.searchsorted(day, d), np.searchsorted(day, d, "right"))
        out[d] = catalogue.advance_by(d, items[at], days["count"][at], categories[at],
                                      {name: values[at] for name, values in fields.items()})
    return out
