"""The examples of one chunk of users, as both preparation drivers build them
(`dare_tf.data.preparation.protocol`, `dare_tf.data.preparation.beam`): what the protocol needs from
the whole log (`LogStatistics`), the negatives (`sample_negatives`), and per
split the examples of a chunk's users (`chunk_examples`): the paper's per-user
targets of a click log, or an impression log's own labels (`--split=time`:
`dare_tf.data.preparation.days`)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.storage.spec import SPLITS
from dare_tf.data.storage.schema import EXAMPLE_TIME, STORE_TIMES, target_feature

USERS_PER_CHUNK = 256
MAX_NEGATIVE_ROUNDS = 1000
# An impression log's user needs a train, a validation and a test impression.
MIN_IMPRESSIONS = 3


@dataclasses.dataclass
class LogStatistics:
    """What the protocol needs from the whole log (both drivers compute it).

    Attributes:
        item_category: `[num_items]` each dense item's category: the last one
            seen for it (the reference overwrites); 0 for padding and OOV.
        item_cdf: `[num_items]` cumulative click counts of the dense items
            (negatives are drawn in proportion to clicks).
        qualifying: dense ids of the users with >= min_clicks clicks (and, in
            an impression log, >= MIN_IMPRESSIONS impressions), ascending.
        num_users: users in the log plus padding row 0.
        item_fields: per further field (`dare_tf.data.storage.fields`), each dense
            item's value, as `item_category`.
    """

    item_category: np.ndarray
    item_cdf: np.ndarray
    qualifying: np.ndarray
    num_users: int
    item_fields: dict = dataclasses.field(default_factory=dict)

    @property
    def num_items(self) -> int:
        return len(self.item_category)

    @functools.cached_property
    def clickable(self) -> int:
        """Items clicked at least once (the most negatives a user could have)."""
        return int((np.diff(self.item_cdf, prepend=0) > 0).sum())

    def chunks(self):
        """`(chunk index, dense user ids)` of the qualifying users, `USERS_PER_CHUNK` at a time."""
        for c, lo in enumerate(range(0, len(self.qualifying), USERS_PER_CHUNK)):
            yield c, self.qualifying[lo: lo + USERS_PER_CHUNK]


def qualifying_users(clicks_per_user: np.ndarray, rows_per_user: np.ndarray | None, protocol) -> np.ndarray:
    """Dense ids (ascending) of the users that qualify: >= min_clicks clicks, and
    in an impression log (`rows_per_user`, impressions per dense id) >=
    MIN_IMPRESSIONS impressions."""
    ok = clicks_per_user >= protocol.min_clicks
    if rows_per_user is not None:
        ok &= rows_per_user >= MIN_IMPRESSIONS
    ok[0] = False  # padding
    return np.flatnonzero(ok)


def sample_negatives(chunk: int, sequences: list[np.ndarray], per_user: int, stats: LogStatistics,
                     seed: int, users=None) -> np.ndarray:
    """`[len(sequences), per_user]` negatives of one chunk of users: items drawn
    with probability proportional to click frequency, rejected if the user
    (row) clicked them anywhere in the log. The stream is seeded by
    `(seed, chunk)`, so chunks can be drawn in any order or in parallel.
    `users` (dense ids of the rows) only name a user in errors."""
    n = len(sequences)
    out = np.zeros((n, per_user), np.int64)
    if per_user == 0 or n == 0:
        return out
    num_items, total = stats.num_items, int(stats.item_cdf[-1])
    clicked = np.unique(np.concatenate([r * num_items + np.asarray(s, np.int64) for r, s in enumerate(sequences)]))
    distinct = np.bincount(clicked // num_items, minlength=n)
    exhausted = np.flatnonzero(distinct >= stats.clickable)
    if len(exhausted):
        who = (f"dense id {int(users[exhausted[0]])}" if users is not None
               else f"row {int(exhausted[0])} of chunk {chunk}")
        raise ValueError(f"user with {who} clicked every item of the log, so no negative can be drawn for it")
    rng = np.random.default_rng([seed, chunk])
    filled = np.zeros(n, np.int64)
    pending = np.arange(n)
    for _ in range(MAX_NEGATIVE_ROUNDS):
        if len(pending) == 0:
            return out
        need = per_user - filled[pending]
        draws = int(need.max() * 1.25) + 4
        cand = np.searchsorted(stats.item_cdf, rng.random(len(pending) * draws) * total, side="right")
        cand = cand.reshape(len(pending), draws)
        keys = pending[:, None] * num_items + cand
        pos = np.minimum(np.searchsorted(clicked, keys), len(clicked) - 1)
        ok = clicked[pos] != keys
        rank = np.cumsum(ok, axis=1) - 1 + filled[pending][:, None]
        take = ok & (rank < per_user)
        rows = np.broadcast_to(pending[:, None], cand.shape)[take]
        out[rows, rank[take]] = cand[take]
        filled[pending] += take.sum(1)
        pending = pending[filled[pending] < per_user]
    raise RuntimeError(f"could not draw {per_user} negatives for {len(pending)} user(s) after "
                       f"{MAX_NEGATIVE_ROUNDS} rounds: they clicked nearly every frequent item")


@dataclasses.dataclass
class UserRows:
    """One user's rows in protocol order (dense ids): its clicks, or in an
    impression log its impressions with `times` and `labels`; `fields`: each
    further field's dense values (`dare_tf.data.storage.fields`); `clicked`
    (`--action_field`): which of its rows, every action, are clicks."""

    items: np.ndarray
    categories: np.ndarray
    times: np.ndarray | None = None
    labels: np.ndarray | None = None
    fields: dict = dataclasses.field(default_factory=dict)
    clicked: np.ndarray | None = None

    def stored(self) -> dict[str, np.ndarray]:
        """The user's store lists (`dare_tf.data.storage.schema.record_columns`) of its clicks:
        every row, or the impressions labelled 1; every click's time last."""
        lists = {"items": self.items, "categories": self.categories, **self.fields, STORE_TIMES: self.times}
        if self.labels is None:
            return lists
        clicked = self.labels == 1
        return {k: v[clicked] for k, v in lists.items()}


def store_rows(users, stored: list[dict]) -> tuple:
    """`PartitionedWriter.write_store`'s arguments of `users` (dense ids, ascending)
    and their `UserRows.stored` lists (both drivers write the store through it)."""
    lists = {k: np.concatenate([s[k] for s in stored] or [np.zeros(0, np.int64)]) for k in
             (stored[0] if stored else ("items", "categories"))}
    return (np.asarray(users, np.int64), np.array([len(s["items"]) for s in stored], np.int64), lists.pop("items"),
            lists.pop("categories"), lists)


def target_columns(rows_fields: dict, row_times, positive, rows, targets, item_fields: dict,
                   time_gap: bool) -> dict[str, np.ndarray]:
    """The examples' further features: each field's target value (`rows_fields`
    at the positive's row `rows`; a negative target (`~positive`) takes its
    item's value: `item_fields[name]`, an array by dense item or a function of
    the items), and with `time_gap` the target's time."""
    def of_items(name):
        values = item_fields[name]
        return values(targets) if callable(values) else values[targets]

    out = {target_feature(name): values[rows] if np.all(positive) else np.where(positive, values[rows],
                                                                                 of_items(name))
           for name, values in rows_fields.items() if name != ACTION_FIELD}  # (history-only)
    if time_gap:
        out[EXAMPLE_TIME] = np.asarray(row_times, np.int64)[rows]
    return out


def chunk_examples(chunk: int, users: np.ndarray, rows: list[UserRows], stats: LogStatistics,
                   protocol) -> dict[str, dict[str, np.ndarray]]:
    """The examples of one chunk of users (dense ids `users`, their rows), per
    split: int32 columns `EXAMPLE_COLUMNS`, user by user. `position` is the
    number of the user's clicks before the target: its history. Click logs:
    each target as [positive, negative_1, ..., negative_n]; impression logs:
    the impressions with their labels. `protocol` is the
    `dare_tf.data.preparation.protocol.Protocol` (`--split=time` builds its examples day
    by day instead: `dare_tf.data.preparation.days`)."""
    time_gap = protocol.time_gap
    if rows and rows[0].labels is not None:
        return _impression_examples(users, rows, time_gap)
    items = [r.items for r in rows]
    categories = [r.categories for r in rows]
    offsets = protocol.target_offsets()
    group = 1 + protocol.negatives
    per_user = sum(len(o) for o in offsets.values()) * protocol.negatives
    negatives = sample_negatives(chunk, items, per_user, stats, protocol.seed, users)
    lengths = np.array([len(s) for s in items], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    if rows and rows[0].clicked is not None:  # `--action_field`: the targets are the clicks among the rows
        click_rows = [np.flatnonzero(r.clicked) for r in rows]
        click_lengths = np.array([len(c) for c in click_rows], np.int64)
        flat_click_rows = np.concatenate([c + s for c, s in zip(click_rows, starts)])
        click_starts = np.concatenate([[0], np.cumsum(click_lengths)[:-1]])
    flat_items, flat_categories = np.concatenate(items), np.concatenate(categories)
    flat_fields = {name: np.concatenate([r.fields[name] for r in rows]) for name in (rows[0].fields if rows else ())}
    flat_times = np.concatenate([r.times for r in rows]) if time_gap else None
    out, used = {}, 0
    for split in SPLITS:
        off = offsets[split]
        if rows and rows[0].clicked is not None:
            nth = (click_lengths[:, None] - off[None, :]).reshape(-1)  # the target's place among its user's clicks
            flat = flat_click_rows[np.repeat(click_starts, len(off)) + nth]
            positions = flat - np.repeat(starts, len(off))
        else:
            positions = (lengths[:, None] - off[None, :]).reshape(-1)  # [U * n], user-major
            flat = np.repeat(starts, len(off)) + positions
        width = len(off) * protocol.negatives
        neg = negatives[:, used: used + width].reshape(len(items) * len(off), protocol.negatives)
        used += width
        target_items = np.concatenate([flat_items[flat][:, None], neg], 1).reshape(-1)
        is_positive = np.arange(len(target_items)) % group == 0
        out[split] = {
            "uid": np.repeat(np.asarray(users), len(off) * group),
            "position": np.repeat(positions, group),
            "target_item": target_items,
            "target_category": np.where(is_positive, flat_categories[np.repeat(flat, group)],
                                        stats.item_category[target_items]),
            "label": is_positive.astype(np.int64),
            **target_columns(flat_fields, flat_times, is_positive, np.repeat(flat, group), target_items,
                             stats.item_fields, time_gap),
        }
    return {split: _int32(columns) for split, columns in out.items()}


def _int32(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Example columns as int32, times (`EXAMPLE_TIME`) kept int64."""
    return {k: v if k == EXAMPLE_TIME else v.astype(np.int32) for k, v in columns.items()}


def _impression_examples(users: np.ndarray, rows: list[UserRows], time_gap: bool) -> dict[str, dict[str, np.ndarray]]:
    """An impression log's examples: per user, its impressions in time order;
    the last is the test example, the one before it validation, the rest train."""
    parts: dict[str, list] = {s: [] for s in SPLITS}
    for uid, r in zip(np.asarray(users).tolist(), rows):
        click_times = r.times[r.labels == 1]  # time-ordered: rows are
        position = np.searchsorted(click_times, r.times, side="left")  # clicks strictly before
        n = len(r.items)
        columns = {"uid": np.full(n, uid), "position": position, "target_item": r.items,
                   "target_category": r.categories, "label": r.labels,
                   **target_columns(r.fields, r.times, np.ones(n, bool), np.arange(n), r.items, {}, time_gap)}
        for split, part in (("train", slice(0, n - 2)), ("val", slice(n - 2, n - 1)), ("test", slice(n - 1, n))):
            parts[split].append({k: np.asarray(v)[part] for k, v in columns.items()})
    return {split: _int32({k: np.concatenate([p[k] for p in parts[split]]) for k in parts[split][0]})
            for split in SPLITS}

