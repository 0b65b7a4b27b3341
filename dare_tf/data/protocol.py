"""The paper's sample construction (as its code, github.com/thuml/DARE, builds it), vectorised,
written as a per-user sequence store and compact examples in TFRecord files.

From the rows of a click log: dense 1-based ids in order of first
appearance, per-user click sequences, the >= min_clicks user filter, train
targets x_{T-2-stride*j} (j < train_targets), validation target x_{T-1}, test
target x_T, and `negatives` negatives per positive drawn by click frequency
and rejected if the user clicked them anywhere in the log. From an impression
log (a 0/1 label per row): each user's impressions in time order are the
examples with their own labels (the last one is the test example, the one
before it the validation example, the earlier ones train), no negatives are
drawn, and each history is the user's clicks strictly before the
impression's time.

What is written (`dare_tf.data.records` reads it), users assigned to
`partitions` partitions by a hash of their id (`spec.partition_of`):

- the store: per qualifying user, one record of its time-ordered item and
  category ids (`store-0000k-of-0000P.tfrecord.gz` holds partition k);
- the examples of each split: one record (user, cut-off position, target
  item, target category, label) per example (`SPLIT-0000k-of-0000P...`
  holds partition k's users' examples); the history of an example is the
  most recent L clicks of its user before the cut-off, assembled when read,
  so L is chosen at training time.

The protocol is split into what needs the whole log (`LogStatistics`: dense
ids, item categories and frequencies, sequence lengths) and what needs one
chunk of `USERS_PER_CHUNK` users only (`chunk_examples`, with its own
negative-sampling stream). The in-memory driver here and the Apache Beam
driver (`dare_tf.data.beam`) share all of it and write the same records.
The dataset directory appears complete or not at all.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time

import numpy as np
from absl import logging

from dare_tf.data.logs import Clicks, LogFormat
from dare_tf.data.prepared import (MAX_PARTITIONS, PartitionedWriter, allow_open_files,
                                   check_compression, guard_dataset_dir, layout_fields, log_format, make_spec,
                                   source_fields, write_id_maps, write_prepared)
from dare_tf.data.log_reader import read_log
from dare_tf.data.logs import dense_ids
from dare_tf.data.spec import FORMAT, MAX_LEN, SPLITS, STORE_KIND, DatasetSpec

USERS_PER_CHUNK = 256
MAX_NEGATIVE_ROUNDS = 1000
MAX_NEGATIVES = 100
# An impression log's user needs a train, a validation and a test impression.
MIN_IMPRESSIONS = 3


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The sample-construction parameters (the paper's code, github.com/thuml/DARE).

    Attributes:
        seed: seed of the negative sampling.
        min_clicks: users with fewer clicks are dropped.
        max_len: the dataset's default history length L (`spec.json`); a
            trainer may choose any other (`--max_len`): histories are
            assembled from the store when read.
        train_targets: train targets per user: x_{T-2-stride*j}, j < train_targets
            (click logs; an impression log's train examples are all of a
            user's impressions before its last two).
        stride: clicks between consecutive train targets (click logs).
        negatives: negatives per positive (click logs).
        partitions: shards of the store and of each split; users are
            assigned to them by a hash of their id, and `multi_worker`
            training gives each worker whole partitions (at least one each).
    """

    seed: int = 0
    min_clicks: int = 210
    max_len: int = 200
    train_targets: int = 19
    stride: int = 5
    negatives: int = 2
    partitions: int = 16

    def __post_init__(self):
        self.validate(impressions=True)  # the checks of every log; prepare adds those of a click log

    def validate(self, impressions: bool = False) -> None:
        # The earliest train target x_{T-2-stride*(n-1)} (1-based) must have a click before it.
        earliest = max(2 + self.stride * (self.train_targets - 1), 0)
        checks = [
            (0 <= self.seed < 2**32, "seed", "must be in [0, 2^32)"),
            (1 <= self.max_len <= MAX_LEN, "max_len", f"must be in [1, {MAX_LEN}]"),
            (0 <= self.train_targets <= 10_000, "train_targets", "must be in [0, 10000]"),
            (1 <= self.stride <= 10_000, "stride", "must be in [1, 10000]"),
            (0 <= self.negatives <= MAX_NEGATIVES, "negatives", f"must be in [0, {MAX_NEGATIVES}]"),
            (1 <= self.partitions <= MAX_PARTITIONS, "partitions", f"must be in [1, {MAX_PARTITIONS}]"),
            (self.min_clicks >= 0, "min_clicks", "must be >= 0"),
            (impressions or self.min_clicks >= earliest + 2, "min_clicks",
             f"must be >= {earliest + 2} so that the earliest train target has a history (train_targets="
             f"{self.train_targets} targets, one every stride={self.stride} clicks, reach {earliest} clicks back); "
             "raise --min_clicks, or lower --train_targets or --stride"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)}: {message}")

    def target_offsets(self) -> dict[str, np.ndarray]:
        """Per split, each target's offset from the end of its user's sequence:
        train T-2-stride*j (1-based), val T-1, test T."""
        return {"train": 3 + self.stride * np.arange(self.train_targets),
                "val": np.array([2]), "test": np.array([1])}


def preparation_id(source_sha256: str, protocol: Protocol, fmt: LogFormat, compression: str) -> str:
    """The id of a preparation: the same for the same log, log format, protocol
    and compression (whichever driver prepared it), different otherwise."""
    text = json.dumps([FORMAT, fmt.to_json(), source_sha256, dataclasses.asdict(protocol), compression],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    """

    item_category: np.ndarray
    item_cdf: np.ndarray
    qualifying: np.ndarray
    num_users: int

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


def qualifying_users(clicks_per_user: np.ndarray, rows_per_user: np.ndarray | None, protocol: Protocol) -> np.ndarray:
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
    impression log its impressions with `times` and `labels`."""

    items: np.ndarray
    categories: np.ndarray
    times: np.ndarray | None = None
    labels: np.ndarray | None = None

    def clicks(self) -> tuple[np.ndarray, np.ndarray]:
        """The user's clicks (the store's sequence): every row, or the impressions labelled 1."""
        if self.labels is None:
            return self.items, self.categories
        clicked = self.labels == 1
        return self.items[clicked], self.categories[clicked]


def chunk_examples(chunk: int, users: np.ndarray, rows: list[UserRows], stats: LogStatistics,
                   protocol: Protocol) -> dict[str, dict[str, np.ndarray]]:
    """The examples of one chunk of users (dense ids `users`, their rows), per
    split: int32 columns `EXAMPLE_COLUMNS`, user by user. `position` is the
    number of the user's clicks before the target: its history. Click logs:
    each target as [positive, negative_1, ..., negative_n]; impression logs:
    the impressions with their labels."""
    if rows and rows[0].labels is not None:
        return _impression_examples(users, rows)
    items = [r.items for r in rows]
    categories = [r.categories for r in rows]
    offsets = protocol.target_offsets()
    group = 1 + protocol.negatives
    per_user = sum(len(o) for o in offsets.values()) * protocol.negatives
    negatives = sample_negatives(chunk, items, per_user, stats, protocol.seed, users)
    lengths = np.array([len(s) for s in items], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat_items, flat_categories = np.concatenate(items), np.concatenate(categories)
    out, used = {}, 0
    for split in SPLITS:
        off = offsets[split]
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
        }
    return {split: {k: v.astype(np.int32) for k, v in columns.items()} for split, columns in out.items()}


def _impression_examples(users: np.ndarray, rows: list[UserRows]) -> dict[str, dict[str, np.ndarray]]:
    """An impression log's examples: per user, its impressions in time order;
    the last is the test example, the one before it validation, the rest train."""
    parts: dict[str, list] = {s: [] for s in SPLITS}
    for uid, r in zip(np.asarray(users).tolist(), rows):
        click_times = r.times[r.labels == 1]  # time-ordered: rows are
        position = np.searchsorted(click_times, r.times, side="left")  # clicks strictly before
        n = len(r.items)
        columns = np.stack([np.full(n, uid), position, r.items, r.categories, r.labels], 1)
        parts["train"].append(columns[: n - 2])
        parts["val"].append(columns[n - 2: n - 1])
        parts["test"].append(columns[n - 1:])
    out = {}
    for split in SPLITS:
        table = np.concatenate(parts[split]) if parts[split] else np.zeros((0, 5), np.int64)
        out[split] = {k: table[:, i].astype(np.int32) for i, k in enumerate(
            ("uid", "position", "target_item", "target_category", "label"))}
    return out


def no_user_qualifies(protocol: Protocol, longest: int, impressions: bool = False) -> ValueError:
    extra = f" and >= {MIN_IMPRESSIONS} impressions" if impressions else ""
    return ValueError(f"no user has >= {protocol.min_clicks} clicks{extra} (the longest history has "
                      f"{longest} clicks); lower --min_clicks or use a larger log")


def build_examples(clicks: Clicks, protocol: Protocol, directory: str, compression: str) -> dict:
    """Writes the store, the example shards and the id maps of `clicks` into
    `directory`; returns the spec fields that depend on the data."""
    user, raw_users = dense_ids(clicks.user)
    item, raw_items = dense_ids(clicks.item)
    category, raw_categories = dense_ids(clicks.category)
    labels, times = clicks.label, clicks.time
    impressions = labels is not None
    # The raw-id columns are no longer needed: release them (peak memory).
    clicks.user = clicks.item = clicks.category = clicks.time = clicks.label = None
    user, item, category = user.astype(np.int32), item.astype(np.int32), category.astype(np.int32)
    # Row 0 is padding and the last row is out-of-vocabulary (never trained on;
    # serving maps unknown raw ids there).
    num_items, num_categories = len(raw_items) + 2, len(raw_categories) + 2
    last = len(item) - 1 - np.unique(item[::-1], return_index=True)[1]
    item_category = np.zeros(num_items, np.int32)
    item_category[item[last]] = category[last]
    del last
    is_click = np.ones(len(user), bool) if not impressions else labels == 1
    rows_per_user = np.bincount(user, minlength=len(raw_users) + 1)
    clicks_per_user = np.bincount(user[is_click], minlength=len(raw_users) + 1)
    stats = LogStatistics(item_category=item_category,
                          item_cdf=np.cumsum(np.bincount(item[is_click], minlength=num_items)),
                          qualifying=qualifying_users(clicks_per_user, rows_per_user if impressions else None,
                                                      protocol),
                          num_users=len(raw_users) + 1)
    logging.info("%d users, %d qualify (>= %d clicks); %d items, %d categories", len(raw_users),
                 len(stats.qualifying), protocol.min_clicks, len(raw_items), len(raw_categories))
    if len(stats.qualifying) == 0:
        raise no_user_qualifies(protocol, int(clicks_per_user.max()), impressions)
    # Only the qualifying users' rows, grouped by user in their order (file or time order).
    keep = np.zeros(len(raw_users) + 1, bool)
    keep[stats.qualifying] = True
    keep = keep[user]
    order = np.flatnonzero(keep)[np.argsort(user[keep], kind="stable")]
    del keep
    seq = {"items": item[order], "categories": category[order]}
    if impressions:
        seq["times"], seq["labels"] = times[order], labels[order]
    del order, user, item, category, times, labels
    q_lengths = rows_per_user[stats.qualifying]
    q_starts = np.concatenate([[0], np.cumsum(q_lengths)[:-1]])
    allow_open_files(4 * protocol.partitions, protocol.partitions)
    writers = {kind: PartitionedWriter(directory, kind, protocol.partitions, compression)
               for kind in (*SPLITS, STORE_KIND)}
    for chunk, users in stats.chunks():
        lo = chunk * USERS_PER_CHUNK
        rows = [UserRows(**{k: v[q_starts[lo + i]: q_starts[lo + i] + q_lengths[lo + i]] for k, v in seq.items()})
                for i in range(len(users))]
        for split, columns in chunk_examples(chunk, users, rows, stats, protocol).items():
            writers[split].write_examples(columns)
        stored = [r.clicks() for r in rows]
        writers[STORE_KIND].write_store(users, np.array([len(i) for i, _ in stored]),
                                        np.concatenate([i for i, _ in stored]), np.concatenate([c for _, c in stored]))
        logging.info("users %d/%d", lo + len(users), len(stats.qualifying))
    files = {}
    for w in writers.values():
        files.update(w.close())
    write_id_maps(directory, raw_items, raw_categories, raw_users, stats.item_category)
    return dict(num_items=num_items, num_categories=num_categories, num_users=stats.num_users,
                users=int(len(stats.qualifying)), **layout_fields(protocol, compression, files))


def prepare(log: str | LogFormat, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False, compression: str = "GZIP") -> DatasetSpec:
    """Raw log -> sequence store, example shards, id maps and spec.json in
    `output_dir`, in memory on one machine (`dare_tf.data.beam.prepare` is the
    same on an Apache Beam runner).

    Args:
        log: a preset's name (`taobao`, `tmall`) or a `LogFormat`.
        compression: `GZIP` or `""` (uncompressed TFRecord files).

    `output_dir` is replaced only when it is absent, empty, or a dataset that
    preparation wrote (see `guard_dataset_dir`); the new one is built in a
    staging directory beside it and renamed into place. Staging directories
    that a killed run of this function left beside it are removed first.
    """
    fmt = log_format(log)
    protocol.validate(fmt.impressions)
    check_compression(compression)
    guard_dataset_dir(output_dir, input_path)
    start = time.perf_counter()
    clicks = read_log(fmt, input_path, skip_bad_lines)
    source = source_fields(input_path, clicks, fmt)
    preparation = preparation_id(clicks.sha256, protocol, fmt, compression)
    spec = write_prepared(output_dir, input_path, lambda staging: make_spec(
        fmt, protocol, source, preparation, build_examples(clicks, protocol, staging, compression)))
    logging.info("wrote %s in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
