"""`--split=time`, day by day: the examples of a log read as UTC days, built so
that a dataset grows by appending a day (`dare_tf.data.preparation.append`) into exactly
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
from typing import Callable

import numpy as np

from dare_tf.data.preparation.catalogue import Catalogue, ClicksToDate
from dare_tf.data.preparation.examples import UserRows, target_columns
from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.preparation.prepared import PartitionedWriter
from dare_tf.data.storage.shards import SEGMENT_KIND, STORE_KIND
from dare_tf.data.storage.schema import EXAMPLE_COLUMNS, EXAMPLE_TIME, STORE_TIMES, TIME_GAP, record_columns
from dare_tf.data.logs.times import DAY


def example_names(fields, time_gap: bool) -> tuple[str, ...]:
    """The columns of `user_day_examples`' tables: the example records' features
    (`dare_tf.data.storage.schema.record_columns`) of the column `fields` (names; the
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
    extra[STORE_TIMES] = rows.times[clicks]  # (every click's time: the history service's timeline and live clicks)
    files.update(write_store(directory, np.arange(1, num_users), lengths[1:], rows.items[clicks],
                             rows.categories[clicks], protocol, compression, int(np.max(rows.times)), extra=extra))
    click_counts = np.bincount(rows.uid[rows.popular], minlength=num_users)
    return files, int((click_counts[1:] >= protocol.min_clicks).sum()), catalogue.counts


def user_examples(uid: int, rows: UserRows, to_date: dict[int, ClicksToDate], protocol, bounds):
    """`(segment's first time, [n, 5] rows)` of one user's examples over all its
    days (its rows in time order with `times`; `to_date` by day): what
    `write_days` writes of the user, for a driver that holds users, not days
    (`dare_tf.data.preparation.beam`)."""
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
