"""`--split=time`, day by day: the examples of a log read as UTC days, built so
that a dataset grows by appending a day (`dare_tf.data.append`) into exactly
what preparing all its days at once writes.

Each day is built from what came before it and from the day itself only:

- a user's examples on day d exist once its clicks up to the end of day d
  reach `min_clicks` (a user qualifies on the day it reaches them; its
  earlier days' rows are history, not examples);
- a click log's negatives of day d are drawn by the clicks up to the end of
  day d (`ClicksToDate`, each item with its category as of that day),
  rejecting what the user clicked up to then, from the stream seeded by
  (seed, day, user); the running counts are kept in the dataset
  (`ITEM_CLICKS_FILE`) for the next append;
- the store holds every user that has a row (its clicks in time order, none
  for a user that only saw impressions), so that a user who qualifies later
  has its whole past.

The examples of a day are written as shards of its time segments: the day,
cut at the windows' first times where one falls inside it, each named by its
first time (`examples-<time>-0000k-of-0000P`); spec.json's splits list the
segments whose first time falls in their window. The store's shards carry
the day they were written on (`store-<time>-0000k-of-0000P`).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Callable

import numpy as np

from dare_tf.data.examples import MAX_NEGATIVE_ROUNDS, UserRows, target_columns
from dare_tf.data.logs import ACTION_FIELD
from dare_tf.data.prepared import PartitionedWriter
from dare_tf.data.shards import SEGMENT_KIND, STORE_KIND
from dare_tf.data.schema import EXAMPLE_COLUMNS, EXAMPLE_TIME, STORE_TIMES, TIME_GAP, record_columns
from dare_tf.data.times import DAY


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
        last = len(items) - 1 - np.unique(items[::-1], return_index=True)[1]
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


def example_names(fields, time_gap: bool) -> tuple[str, ...]:
    """The columns of `user_day_examples`' tables: the example records' features
    (`dare_tf.data.schema.record_columns`) of the column `fields` (names; the
    action's is history-only) and (`time_gap`) the time gap."""
    entries = [{"name": f, "history_only": f == ACTION_FIELD} for f in fields]
    return record_columns(entries + ([{"name": TIME_GAP}] if time_gap else []))[0]


def user_day_examples(uid: int, stored: np.ndarray, rows: UserRows, clicks: ClicksToDate, protocol,
                      bounds: tuple[int, int], stored_clicks: int | None = None) -> dict[int, np.ndarray]:
    """One user's examples of one day: `{segment's first time: [n, C] int64 rows}`
    (columns `example_names`), from its history before the day (`stored`, dense
    items: its clicks, or with `--action_field` every action, of which
    `stored_clicks` are clicks) and its rows of the day (`rows`, in time order
    with `times`)."""
    impressions = rows.labels is not None
    is_click = np.ones(len(rows.items), bool) if not impressions else rows.labels == 1  # (the history's rows)
    click_times = rows.times[is_click]
    today = len(click_times) if rows.clicked is None else int(rows.clicked.sum())
    if (len(stored) if stored_clicks is None else stored_clicks) + today < protocol.min_clicks:
        return {}
    position = len(stored) + np.searchsorted(click_times, rows.times, side="left")  # history strictly before
    keep = np.arange(len(position)) if impressions else np.flatnonzero(
        (position > 0) & (True if rows.clicked is None else rows.clicked))
    if len(keep) == 0:
        return {}
    time_gap = protocol.time_gap
    if impressions:
        group = 1
        table = np.stack([np.full(len(keep), uid), position[keep], rows.items[keep], rows.categories[keep],
                          rows.labels[keep], *target_columns(rows.fields, rows.times, np.ones(len(keep), bool), keep,
                                                             rows.items[keep], {}, time_gap).values()],
                         1).astype(np.int64)
    else:
        group = 1 + protocol.negatives
        rng = np.random.default_rng([protocol.seed, clicks.day, uid])
        clicked = np.unique(np.concatenate([stored, rows.items]))
        drawn = clicks.draw(len(keep) * protocol.negatives, clicked, rng, uid).reshape(len(keep), -1)
        targets = np.concatenate([rows.items[keep][:, None], drawn], 1)
        categories = np.concatenate([rows.categories[keep][:, None], clicks.category_of(drawn)], 1)
        positive = np.broadcast_to(np.arange(group) == 0, targets.shape)
        further = target_columns(rows.fields, rows.times, positive, np.broadcast_to(keep[:, None], targets.shape),
                                 targets, {name: clicks.field_of(name) for name in rows.fields}, time_gap)
        table = np.stack([np.full(targets.shape, uid), np.broadcast_to(position[keep][:, None], targets.shape),
                          targets, categories, positive, *further.values()],
                         -1).reshape(-1, len(EXAMPLE_COLUMNS) + len(further)).astype(np.int64)
    window = np.searchsorted(np.asarray(bounds), rows.times[keep], side="right")
    starts = np.maximum(clicks.day * DAY, np.array([clicks.day * DAY, *bounds], np.int64)[window])
    segment = np.repeat(starts, group)
    return {int(s): table[segment == s] for s in np.unique(segment)}


@dataclasses.dataclass
class LogRows:
    """The rows a time split writes: dense int arrays in time order. `labels`:
    None for a click log (every row a click), else each impression's 0/1;
    `fields`: the further fields' values; `clicked`, with `--action_field`:
    which rows (every action is history) are clicks."""

    uid: np.ndarray
    items: np.ndarray
    categories: np.ndarray
    times: np.ndarray
    labels: np.ndarray | None = None
    fields: dict = dataclasses.field(default_factory=dict)
    clicked: np.ndarray | None = None

    def __post_init__(self):
        for name in ("uid", "items", "categories", "times"):
            setattr(self, name, np.asarray(getattr(self, name), np.int64))
        self.fields = {k: np.asarray(v, np.int64) for k, v in self.fields.items()}

    @property
    def is_click(self) -> np.ndarray:
        """The rows that are history: every row of a click log, the clicked impressions."""
        return np.ones(len(self.uid), bool) if self.labels is None else np.asarray(self.labels) == 1

    @property
    def popular(self) -> np.ndarray:
        """The rows that count as clicks (negatives are drawn by them; a user qualifies by them)."""
        return self.is_click if self.clicked is None else np.asarray(self.clicked)


def _no_history(uid: int) -> np.ndarray:
    del uid
    return np.zeros(0, np.int64)


@dataclasses.dataclass
class Past:
    """What a dataset holds before the rows it is given: the catalogue as of its
    last day (advanced over the new days), each user's history (`history(uid)`,
    dense items) and how many of those are clicks (`clicks(uid)`; default all).
    A whole log starts from an empty catalogue and no history."""

    catalogue: Catalogue
    history: Callable[[int], np.ndarray] = _no_history
    clicks: Callable[[int], int] | None = None

    def click_count(self, uid: int) -> int:
        return len(self.history(uid)) if self.clicks is None else int(self.clicks(uid))


def write_days(directory: str, rows: LogRows, past: Past, protocol, bounds, compression: str) -> dict[str, dict]:
    """Writes the example segments of `rows`' days, grouped by day, each day's
    users in ascending order, each user's history its `past` and its earlier
    rows; `past.catalogue` is advanced over the days. Returns the shards'
    spec.json `files` entries."""
    uid, items, times, fields = rows.uid, rows.items, rows.times, rows.fields
    names = example_names(fields, protocol.time_gap)
    is_click, popular = rows.is_click, rows.popular
    # Each user's history rows in time order: its past grows by them day by day.
    by_user = np.argsort(uid, kind="stable")
    user_clicks = by_user[is_click[by_user]]
    first_click = dict(zip(*np.unique(uid[user_clicks], return_index=True)))
    consumed: dict[int, int] = {}
    clicks_so_far: dict[int, int] = {}
    files = {}
    day = times // DAY
    order = np.lexsort((np.arange(len(uid)), uid, day))  # by day, user, then time
    day_starts = np.flatnonzero(np.diff(day[order], prepend=-1))
    for lo, hi in zip(day_starts, [*day_starts[1:], len(order)]):
        rows_d = order[lo:hi]
        clicks = past.catalogue.advance(int(day[rows_d[0]]), items[rows_d], rows.categories[rows_d],
                                        popular[rows_d], {k: v[rows_d] for k, v in fields.items()})
        segments: dict[int, list] = {}
        user_starts = np.flatnonzero(np.diff(uid[rows_d], prepend=-1))
        for a, b in zip(user_starts, [*user_starts[1:], len(rows_d)]):
            r = rows_d[a:b]
            u = int(uid[r[0]])
            done = consumed.get(u, 0)
            start = first_click.get(u, 0)
            stored = np.concatenate([past.history(u), items[user_clicks[start: start + done]]])
            today = UserRows(items=items[r], categories=rows.categories[r], times=times[r],
                             labels=None if rows.labels is None else np.asarray(rows.labels)[r],
                             fields={k: v[r] for k, v in fields.items()},
                             clicked=None if rows.clicked is None else popular[r])
            if u not in clicks_so_far:
                clicks_so_far[u] = past.click_count(u)
            for tag, table in user_day_examples(u, stored, today, clicks, protocol, bounds,
                                                clicks_so_far[u]).items():
                segments.setdefault(tag, []).append(table)
            consumed[u] = done + int(is_click[r].sum())
            clicks_so_far[u] += int(popular[r].sum())
        for tag in sorted(segments):
            table = np.concatenate(segments[tag])
            writer = PartitionedWriter(directory, SEGMENT_KIND, protocol.partitions, compression, tag=tag)
            writer.write_examples(table_columns(table, names))
            files.update(writer.close())
    return files


def table_columns(table: np.ndarray, names) -> dict[str, np.ndarray]:
    """A `[n, C]` table of `user_day_examples` as the writer's columns (int32, times int64)."""
    return {k: table[:, i] if k == EXAMPLE_TIME else table[:, i].astype(np.int32) for i, k in enumerate(names)}


def write_store(directory: str, uid, lengths, items, categories, protocol, compression: str, last_time: int,
                indices=None, extra: dict | None = None) -> dict[str, dict]:
    """The store shards (of partitions `indices`, default all) of the users `uid`
    (ascending; `lengths` clicks each, flat `items`, `categories` and the
    `extra` lists), named by the day of `last_time`."""
    writer = PartitionedWriter(directory, STORE_KIND, protocol.partitions, compression, indices=indices,
                               tag=int(last_time) // DAY * DAY)
    writer.write_store(np.asarray(uid), np.asarray(lengths), np.asarray(items), np.asarray(categories),
                       {k: np.asarray(v) for k, v in (extra or {}).items()})
    return writer.close()


def build_time_split(directory: str, rows: LogRows, num_users: int, num_items: int, protocol, bounds,
                     compression: str) -> tuple[dict[str, dict], int, np.ndarray]:
    """`--split=time` from a whole log (`rows`, from an empty past): the example
    segments of every day and the store of every user. Returns the files, the
    number of users that reached `min_clicks` and every item's clicks."""
    catalogue = Catalogue(np.zeros(num_items, np.int64), np.zeros(num_items, np.int64),
                          {k: np.zeros(num_items, np.int64) for k in rows.fields})
    files = write_days(directory, rows, Past(catalogue), protocol, bounds, compression)
    is_click = rows.is_click
    clicks = np.flatnonzero(is_click)[np.argsort(rows.uid[is_click], kind="stable")]
    lengths = np.bincount(rows.uid[is_click], minlength=num_users)
    extra = {k: v[clicks] for k, v in rows.fields.items()}
    if protocol.time_gap:
        extra[STORE_TIMES] = rows.times[clicks]
    files.update(write_store(directory, np.arange(1, num_users), lengths[1:], rows.items[clicks],
                             rows.categories[clicks], protocol, compression, int(np.max(rows.times)), extra=extra))
    click_counts = np.bincount(rows.uid[rows.popular], minlength=num_users)
    return files, int((click_counts[1:] >= protocol.min_clicks).sum()), catalogue.counts


def user_examples(uid: int, rows: UserRows, to_date: dict[int, ClicksToDate], protocol, bounds):
    """`(segment's first time, [n, 5] rows)` of one user's examples over all its
    days (its rows in time order with `times`; `to_date` by day): what
    `write_days` writes of the user, for a driver that holds users, not days
    (`dare_tf.data.beam`)."""
    day = rows.times // DAY
    is_click = np.ones(len(day), bool) if rows.labels is None else rows.labels == 1
    starts = np.flatnonzero(np.diff(day, prepend=-1))
    for lo, hi in zip(starts, [*starts[1:], len(day)]):
        stored = rows.items[:lo][is_click[:lo]].astype(np.int64)
        today = UserRows(items=rows.items[lo:hi], categories=rows.categories[lo:hi], times=rows.times[lo:hi],
                         labels=None if rows.labels is None else rows.labels[lo:hi],
                         fields={k: v[lo:hi] for k, v in rows.fields.items()},
                         clicked=None if rows.clicked is None else rows.clicked[lo:hi])
        yield from user_day_examples(uid, stored, today, to_date[int(day[lo])], protocol, bounds,
                                     None if rows.clicked is None else int(rows.clicked[:lo].sum())).items()


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
