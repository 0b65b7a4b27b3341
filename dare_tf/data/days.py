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

import numpy as np

from dare_tf.data.examples import MAX_NEGATIVE_ROUNDS, UserRows
from dare_tf.data.prepared import PartitionedWriter
from dare_tf.data.spec import EXAMPLE_COLUMNS, SEGMENT_KIND, STORE_KIND

DAY = 86_400  # seconds: the time column is read as seconds since the epoch (UTC)


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
    """

    day: int
    items: np.ndarray
    cdf: np.ndarray
    categories: np.ndarray

    def category_of(self, items: np.ndarray) -> np.ndarray:
        return self.categories[np.searchsorted(self.items, items)]

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
    """The items' click counts and categories (dense, `[num_items]`) as of the end
    of the last day it was advanced over: zeros before a log's first day, the
    dataset's `ITEM_CLICKS_FILE` and `ITEM_CATEGORY_FILE` before an appended one."""

    def __init__(self, counts: np.ndarray, categories: np.ndarray):
        self.counts, self.categories = np.asarray(counts, np.int64).copy(), np.asarray(categories, np.int64).copy()

    def advance(self, day: int, items, categories, clicks) -> ClicksToDate:
        """Adds a day: its rows' dense `items` and `categories` in time order
        (`clicks`: where a row is a click), each item keeping its last category."""
        items, categories = np.asarray(items, np.int64), np.asarray(categories, np.int64)
        self.counts += np.bincount(items[clicks], minlength=len(self.counts))
        last = len(items) - 1 - np.unique(items[::-1], return_index=True)[1]
        self.categories[items[last]] = categories[last]
        return self.to_date(day)

    def advance_by(self, day: int, entries) -> ClicksToDate:
        """`advance` from a day's `(item, clicks, last category)` entries."""
        for item, count, category in entries:
            self.counts[item] += count
            self.categories[item] = category
        return self.to_date(day)

    def to_date(self, day: int) -> ClicksToDate:
        items = np.flatnonzero(self.counts)
        return ClicksToDate(int(day), items, np.cumsum(self.counts[items]), self.categories[items].copy())


def user_day_examples(uid: int, stored: np.ndarray, rows: UserRows, clicks: ClicksToDate, protocol,
                      bounds: tuple[int, int]) -> dict[int, np.ndarray]:
    """One user's examples of one day: `{segment's first time: [n, 5] int64 rows}`
    (columns `EXAMPLE_COLUMNS`), from its clicks before the day (`stored`, dense
    items) and its rows of the day (`rows`, in time order with `times`)."""
    impressions = rows.labels is not None
    is_click = np.ones(len(rows.items), bool) if not impressions else rows.labels == 1
    click_times = rows.times[is_click]
    if len(stored) + len(click_times) < protocol.min_clicks:
        return {}
    position = len(stored) + np.searchsorted(click_times, rows.times, side="left")  # clicks strictly before
    keep = np.arange(len(position)) if impressions else np.flatnonzero(position > 0)
    if len(keep) == 0:
        return {}
    if impressions:
        group = 1
        table = np.stack([np.full(len(keep), uid), position[keep], rows.items[keep], rows.categories[keep],
                          rows.labels[keep]], 1).astype(np.int64)
    else:
        group = 1 + protocol.negatives
        rng = np.random.default_rng([protocol.seed, clicks.day, uid])
        clicked = np.unique(np.concatenate([stored, rows.items]))
        drawn = clicks.draw(len(keep) * protocol.negatives, clicked, rng, uid).reshape(len(keep), -1)
        targets = np.concatenate([rows.items[keep][:, None], drawn], 1)
        categories = np.concatenate([rows.categories[keep][:, None], clicks.category_of(drawn)], 1)
        table = np.stack([np.full(targets.shape, uid), np.broadcast_to(position[keep][:, None], targets.shape),
                          targets, categories, np.broadcast_to(np.arange(group) == 0, targets.shape)],
                         -1).reshape(-1, len(EXAMPLE_COLUMNS)).astype(np.int64)
    window = np.searchsorted(np.asarray(bounds), rows.times[keep], side="right")
    starts = np.maximum(clicks.day * DAY, np.array([clicks.day * DAY, *bounds], np.int64)[window])
    segment = np.repeat(starts, group)
    return {int(s): table[segment == s] for s in np.unique(segment)}


def write_days(directory: str, uid, items, categories, times, labels, prior, catalogue: Catalogue, protocol,
               bounds, compression: str) -> dict[str, dict]:
    """Writes the example segments of `times`' days: the rows (dense int arrays,
    in time order; `labels` None for a click log) grouped by day, each day's
    users in ascending order. `prior(uid)` gives a user's clicks before these
    rows (dense items); `catalogue` is advanced over the days. Returns the
    shards' spec.json `files` entries."""
    uid, items, times = np.asarray(uid, np.int64), np.asarray(items, np.int64), np.asarray(times, np.int64)
    categories = np.asarray(categories, np.int64)
    is_click = np.ones(len(uid), bool) if labels is None else np.asarray(labels) == 1
    # Each user's clicks of these rows in time order: its past grows by them day by day.
    by_user = np.argsort(uid, kind="stable")
    user_clicks = by_user[is_click[by_user]]
    first_click = dict(zip(*np.unique(uid[user_clicks], return_index=True)))
    consumed: dict[int, int] = {}
    files = {}
    day = times // DAY
    order = np.lexsort((np.arange(len(uid)), uid, day))  # by day, user, then time
    day_starts = np.flatnonzero(np.diff(day[order], prepend=-1))
    for lo, hi in zip(day_starts, [*day_starts[1:], len(order)]):
        rows_d = order[lo:hi]
        clicks = catalogue.advance(int(day[rows_d[0]]), items[rows_d], categories[rows_d], is_click[rows_d])
        segments: dict[int, list] = {}
        user_starts = np.flatnonzero(np.diff(uid[rows_d], prepend=-1))
        for a, b in zip(user_starts, [*user_starts[1:], len(rows_d)]):
            r = rows_d[a:b]
            u = int(uid[r[0]])
            done = consumed.get(u, 0)
            start = first_click.get(u, 0)
            stored = np.concatenate([prior(u), items[user_clicks[start: start + done]]])
            rows = UserRows(items=items[r], categories=categories[r], times=times[r],
                            labels=None if labels is None else np.asarray(labels)[r])
            for tag, table in user_day_examples(u, stored, rows, clicks, protocol, bounds).items():
                segments.setdefault(tag, []).append(table)
            consumed[u] = done + int(is_click[r].sum())
        for tag in sorted(segments):
            table = np.concatenate(segments[tag])
            writer = PartitionedWriter(directory, SEGMENT_KIND, protocol.partitions, compression, tag=tag)
            writer.write_examples({k: table[:, i].astype(np.int32) for i, k in enumerate(EXAMPLE_COLUMNS)})
            files.update(writer.close())
    return files


def write_store(directory: str, uid, lengths, items, categories, protocol, compression: str, last_time: int,
                indices=None) -> dict[str, dict]:
    """The store shards (of partitions `indices`, default all) of the users `uid`
    (ascending; `lengths` clicks each, flat `items`, `categories`), named by the
    day of `last_time`."""
    writer = PartitionedWriter(directory, STORE_KIND, protocol.partitions, compression, indices=indices,
                               tag=int(last_time) // DAY * DAY)
    writer.write_store(np.asarray(uid), np.asarray(lengths), np.asarray(items), np.asarray(categories))
    return writer.close()


def build_time_split(directory: str, user, item, category, times, labels, num_users: int, num_items: int,
                     protocol, bounds, compression: str) -> tuple[dict[str, dict], int, np.ndarray]:
    """`--split=time` from a whole log (dense ids, rows in time order): the
    example segments of every day and the store of every user. Returns the
    files, the number of users that reached `min_clicks` and every item's clicks."""
    catalogue = Catalogue(np.zeros(num_items, np.int64), np.zeros(num_items, np.int64))
    files = write_days(directory, user, item, category, times, labels, lambda u: np.zeros(0, np.int64), catalogue,
                       protocol, bounds, compression)
    is_click = np.ones(len(user), bool) if labels is None else np.asarray(labels) == 1
    clicks = np.flatnonzero(is_click)[np.argsort(np.asarray(user)[is_click], kind="stable")]
    lengths = np.bincount(np.asarray(user)[is_click], minlength=num_users)
    files.update(write_store(directory, np.arange(1, num_users), lengths[1:], np.asarray(item)[clicks],
                             np.asarray(category)[clicks], protocol, compression, int(np.max(times))))
    return files, int((lengths[1:] >= protocol.min_clicks).sum()), catalogue.counts


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
                         labels=None if rows.labels is None else rows.labels[lo:hi])
        yield from user_day_examples(uid, stored, today, to_date[int(day[lo])], protocol, bounds).items()


def day_item_summaries(items, categories, times, keys, labels):
    """`((day, item), (clicks, last (time, key), category at the last row))` of
    one user's rows (raw ids), merged over users by `merge_day_items` and
    stepped through by `clicks_by_day`."""
    by = {}
    for i in range(len(items)):
        k = (int(times[i]) // DAY, int(items[i]))
        count, last, category = by.get(k, (0, None, None))
        at = (int(times[i]), int(keys[i]))
        count += int(labels[i] == 1)
        by[k] = (count, at, int(categories[i])) if last is None or at >= last else (count, last, category)
    return list(by.items())


def merge_day_items(values):
    values = list(values)
    last = max(values, key=lambda v: v[1])
    return sum(v[0] for v in values), last[1], last[2]


def clicks_by_day(summaries, item_dense: dict, category_dense: dict, num_items: int) -> dict[int, ClicksToDate]:
    """`{day: ClicksToDate}` of every day of the merged summaries (raw ids)."""
    days: dict[int, list] = {}
    for (day, raw_item), (count, _, raw_category) in summaries:
        days.setdefault(day, []).append((item_dense[raw_item], count, category_dense[raw_category]))
    catalogue = Catalogue(np.zeros(num_items, np.int64), np.zeros(num_items, np.int64))
    return {day: catalogue.advance_by(day, days[day]) for day in sorted(days)}
