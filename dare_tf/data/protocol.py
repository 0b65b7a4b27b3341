"""The paper's sample construction (reference.md, "Data protocol"), vectorised,
written as a per-user sequence store and compact examples.

From the click rows of a log: dense 1-based ids in order of first appearance,
per-user click sequences, the >= min_clicks user filter, train targets
x_{T-2-stride*j} (j < train_targets), validation target x_{T-1}, test target
x_T, and `negatives` negatives per positive drawn by click frequency and
rejected if the user clicked them anywhere in the log.

What is written (`dare_tf.data.store` reads it):
- the store: each qualifying user's time-ordered item and category ids,
  once (`store-NNNNN.npz`, `users_per_store_shard` users each);
- the examples of each split: (user, cut-off position, target item, target
  category, label) (`SPLIT-NNNNN.npz`); the history of an example is the
  most recent L clicks of its user before the cut-off, assembled when read,
  so L is chosen at training time.

The protocol is split into what needs the whole log (`LogStatistics`: dense
ids, item categories and frequencies, sequence lengths) and what needs one
chunk of `USERS_PER_CHUNK` users only (`chunk_examples`, with its own
negative-sampling stream); shards hold whole users. The in-memory driver
here and the Apache Beam driver (`dare_tf.data.beam`) share all of it and
write the same files. The dataset directory appears complete or not at all.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time

import numpy as np
from absl import logging

from dare_tf._files import clean_stale, describe_entries, replace_directory, staging_dir
from dare_tf.data.logs import FORMATS, Clicks, read_clicks
from dare_tf.data.spec import (EXAMPLE_COLUMNS, FORMAT, ID_MAP_FILES, LEGACY_FORMATS, SPEC_FILE, SPLITS,
                               STORE_CLICK_COLUMNS, STORE_USER_COLUMNS, DatasetSpec, example_shard_name,
                               store_shard_name)

USERS_PER_CHUNK = 256
MAX_NEGATIVE_ROUNDS = 1000


class OutputDirError(ValueError):
    """The output directory cannot be (re)written without losing data that is not ours."""


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The sample-construction parameters (reference.md, "Data protocol").

    Attributes:
        seed: seed of the negative sampling.
        min_clicks: users with fewer clicks are dropped.
        max_len: the dataset's default history length L (`spec.json`); a
            trainer may choose any other (`--max_len`): histories are
            assembled from the store when read.
        train_targets: train targets per user: x_{T-2-stride*j}, j < train_targets.
        stride: clicks between consecutive train targets.
        negatives: negatives per positive.
        examples_per_shard: at most this many examples per example shard
            (shards hold whole users: at least one user each).
        users_per_store_shard: users per store shard.
    """

    seed: int = 0
    min_clicks: int = 210
    max_len: int = 200
    train_targets: int = 19
    stride: int = 5
    negatives: int = 2
    examples_per_shard: int = 50_000
    users_per_store_shard: int = 16_384

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        # The earliest train target x_{T-2-stride*(n-1)} (1-based) must have a click before it.
        earliest = max(2 + self.stride * (self.train_targets - 1), 0)
        checks = [
            (self.max_len >= 1, "max_len", "must be >= 1"),
            (self.train_targets >= 0, "train_targets", "must be >= 0"),
            (self.stride >= 1, "stride", "must be >= 1"),
            (self.negatives >= 0, "negatives", "must be >= 0"),
            (self.examples_per_shard >= 1, "examples_per_shard", "must be >= 1"),
            (self.users_per_store_shard >= 1, "users_per_store_shard", "must be >= 1"),
            (self.min_clicks >= earliest + 2, "min_clicks",
             f"must be >= {earliest + 2} so that the earliest train target has a history"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)}: {message}")

    def target_offsets(self) -> dict[str, np.ndarray]:
        """Per split, each target's offset from the end of its user's sequence:
        train T-2-stride*j (1-based), val T-1, test T."""
        return {"train": 3 + self.stride * np.arange(self.train_targets),
                "val": np.array([2]), "test": np.array([1])}

    def examples_per_user(self, split: str) -> int:
        return len(self.target_offsets()[split]) * (1 + self.negatives)

    def users_per_shard(self, split: str) -> int:
        """Users per example shard of `split` (shards hold whole users)."""
        return max(1, self.examples_per_shard // max(self.examples_per_user(split), 1))


def preparation_id(source_sha256: str, protocol: Protocol, dataset: str) -> str:
    """The id both the store and the examples record: the same for the same log,
    dataset format and protocol (whichever driver prepared them), different
    otherwise."""
    text = json.dumps([FORMAT, dataset, source_sha256, dataclasses.asdict(protocol)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dense_ids(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense 1-based ids in order of first appearance, and the raw id of each dense id."""
    uniq, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(1, len(uniq) + 1)
    return rank[inverse].reshape(-1), uniq[order]


def time_sorted(clicks: Clicks) -> Clicks:
    """Tmall's reference order: users in order of first click, each user's clicks
    stably sorted by time (the raw log is not time-ordered)."""
    user_rank, _ = dense_ids(clicks.user)
    order = np.lexsort((clicks.time, user_rank))  # lexsort is stable
    return dataclasses.replace(clicks, user=clicks.user[order], item=clicks.item[order],
                               category=clicks.category[order], time=clicks.time[order])


@dataclasses.dataclass
class LogStatistics:
    """What the protocol needs from the whole log (both drivers compute it).

    Attributes:
        item_category: `[num_items]` each dense item's category: the last one
            seen for it (the reference overwrites); 0 for padding and OOV.
        item_cdf: `[num_items]` cumulative click counts of the dense items
            (negatives are drawn in proportion to clicks).
        qualifying: dense ids of the users with >= min_clicks clicks, ascending.
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
        who = f"dense id {int(users[exhausted[0]])}" if users is not None else f"row {int(exhausted[0])} of chunk {chunk}"
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


def chunk_examples(chunk: int, users: np.ndarray, items: list[np.ndarray], categories: list[np.ndarray],
                   stats: LogStatistics, protocol: Protocol) -> dict[str, dict[str, np.ndarray]]:
    """The examples of one chunk of users (dense ids `users`, their click
    sequences `items` and `categories`), per split: int32 columns
    `EXAMPLE_COLUMNS`, user by user, each target as [positive, negative_1,
    ..., negative_n]. `position` is the target's index in its user's sequence:
    the history is the clicks before it."""
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
        neg = negatives[:, used: used + len(off) * protocol.negatives].reshape(-1, protocol.negatives)
        used += len(off) * protocol.negatives
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
        out[split] = {k: v.astype(np.int32) for k, v in out[split].items()}
    return out


def write_shard(path: str, preparation: str, columns: dict[str, np.ndarray]) -> int:
    """Writes one shard (an uncompressed `.npz` of the columns and the
    preparation id); returns its size in bytes."""
    with open(path, "wb") as f:
        np.savez(f, preparation=np.array(preparation), **columns)
    return os.path.getsize(path)


def concat_columns(parts: list[dict[str, np.ndarray]], names) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]).astype(np.int32) if parts else np.zeros(0, np.int32)
            for k in names}


def write_user_shard(directory: str, kind: str, index: int, parts: list[dict[str, np.ndarray]],
                     preparation: str) -> tuple[str, int, int]:
    """Shard `index` of `kind` (a split's examples, or `store`) from its users'
    columns, in user order; returns its name, size in bytes, and rows (examples,
    or the store's clicks). Both drivers write every shard through it."""
    if kind == "store":
        name, columns = store_shard_name(index), concat_columns(parts, STORE_USER_COLUMNS + STORE_CLICK_COLUMNS)
        count = int(columns["length"].sum())
    else:
        name, columns = example_shard_name(kind, index), concat_columns(parts, EXAMPLE_COLUMNS)
        count = len(columns["uid"])
    return name, write_shard(os.path.join(directory, name), preparation, columns), count


class _ShardWriter:
    """Collects whole users of one kind of shard (a split's examples, with
    `rows_per_user` rows each, or the store) and writes a shard each
    `users_per_shard` users."""

    def __init__(self, directory: str, kind: str, users_per_shard: int, preparation: str,
                 rows_per_user: int | None = None):
        self.directory, self.kind, self.users_per_shard = directory, kind, users_per_shard
        self.preparation, self.rows_per_user = preparation, rows_per_user
        self.sizes: dict[str, int] = {}
        self.count = 0
        self._parts: list[tuple[int, dict]] = []  # (users, columns)
        self._pending = 0  # users in _parts

    def write(self, users: int, columns: dict[str, np.ndarray]) -> None:
        """Adds `users` users' columns; full shards are written at once."""
        self._parts.append((users, columns))
        self._pending += users
        while self._pending >= self.users_per_shard:
            self._flush(self.users_per_shard)

    def _flush(self, users: int) -> None:
        taken, rest, need = [], [], users
        for n, cols in self._parts:
            if need >= n:
                taken.append(cols)
                need -= n
            elif need > 0:
                head, tail = self._split(cols, need)
                taken.append(head)
                rest.append((n - need, tail))
                need = 0
            else:
                rest.append((n, cols))
        self._parts, self._pending = rest, self._pending - users
        name, size, count = write_user_shard(self.directory, self.kind, len(self.sizes), taken, self.preparation)
        self.sizes[name] = size
        self.count += count

    def _split(self, columns: dict[str, np.ndarray], users: int):
        """`columns` of several users cut after the first `users` of them."""
        if self.kind != "store":
            rows = users * self.rows_per_user
            return {k: v[:rows] for k, v in columns.items()}, {k: v[rows:] for k, v in columns.items()}
        clicks = int(columns["length"][:users].sum())
        cut = {**{k: users for k in STORE_USER_COLUMNS}, **{k: clicks for k in STORE_CLICK_COLUMNS}}
        return {k: v[:cut[k]] for k, v in columns.items()}, {k: v[cut[k]:] for k, v in columns.items()}

    def close(self) -> None:
        if self._pending or not self.sizes:  # an empty split still gets one (empty) shard
            self._flush(self._pending)


def _write_id_map(path: str, raw_ids: np.ndarray) -> None:
    with open(path, "w") as f:
        f.write("\n".join(map(str, raw_ids.tolist())))
        f.write("\n")


def write_id_maps(directory: str, raw_items, raw_categories, raw_users) -> None:
    _write_id_map(os.path.join(directory, ID_MAP_FILES["item"]), np.asarray(raw_items))
    _write_id_map(os.path.join(directory, ID_MAP_FILES["category"]), np.asarray(raw_categories))
    _write_id_map(os.path.join(directory, ID_MAP_FILES["user"]), np.asarray(raw_users))


def no_user_qualifies(protocol: Protocol, longest: int) -> ValueError:
    return ValueError(f"no user has >= {protocol.min_clicks} clicks (the longest history has "
                      f"{longest}); lower --min_clicks or use a larger log")


def build_examples(clicks: Clicks, protocol: Protocol, directory: str, preparation: str) -> dict:
    """Writes the store, the example shards and the id maps of `clicks` into
    `directory`; returns the spec fields that depend on the data."""
    user, raw_users = dense_ids(clicks.user)
    item, raw_items = dense_ids(clicks.item)
    category, raw_categories = dense_ids(clicks.category)
    # The raw-id columns are no longer needed: release them (peak memory).
    clicks.user = clicks.item = clicks.category = clicks.time = None
    user, item, category = user.astype(np.int32), item.astype(np.int32), category.astype(np.int32)
    # Row 0 is padding and the last row is out-of-vocabulary (never trained on;
    # serving maps unknown raw ids there).
    num_items, num_categories = len(raw_items) + 2, len(raw_categories) + 2
    last = len(item) - 1 - np.unique(item[::-1], return_index=True)[1]
    item_category = np.zeros(num_items, np.int32)
    item_category[item[last]] = category[last]
    del last
    lengths = np.bincount(user, minlength=len(raw_users) + 1)
    stats = LogStatistics(item_category=item_category,
                          item_cdf=np.cumsum(np.bincount(item, minlength=num_items)),
                          qualifying=np.nonzero(lengths >= protocol.min_clicks)[0],
                          num_users=len(raw_users) + 1)
    logging.info("%d users, %d qualify (>= %d clicks); %d items, %d categories", len(raw_users),
                 len(stats.qualifying), protocol.min_clicks, len(raw_items), len(raw_categories))
    if len(stats.qualifying) == 0:
        raise no_user_qualifies(protocol, int(lengths.max()))
    # Only the qualifying users' clicks, grouped by user in their order (file or time order).
    keep = lengths[user] >= protocol.min_clicks
    order = np.flatnonzero(keep)[np.argsort(user[keep], kind="stable")]
    del keep
    seq_items, seq_categories = item[order], category[order]
    del order, user, item, category
    q_lengths = lengths[stats.qualifying]
    q_starts = np.concatenate([[0], np.cumsum(q_lengths)[:-1]])
    writers = {s: _ShardWriter(directory, s, protocol.users_per_shard(s), preparation, protocol.examples_per_user(s))
               for s in SPLITS}
    store = _ShardWriter(directory, "store", protocol.users_per_store_shard, preparation)
    for chunk, users in stats.chunks():
        lo = chunk * USERS_PER_CHUNK
        bounds = [(q_starts[lo + i], q_starts[lo + i] + q_lengths[lo + i]) for i in range(len(users))]
        items = [seq_items[a:b] for a, b in bounds]
        categories = [seq_categories[a:b] for a, b in bounds]
        for split, columns in chunk_examples(chunk, users, items, categories, stats, protocol).items():
            writers[split].write(len(users), columns)
        a, b = bounds[0][0], bounds[-1][1]
        store.write(len(users), {"uid": users.astype(np.int32), "length": q_lengths[lo: lo + len(users)].astype(np.int32),
                                 "items": seq_items[a:b], "categories": seq_categories[a:b]})
        logging.info("users %d/%d", lo + len(users), len(stats.qualifying))
    for w in (*writers.values(), store):
        w.close()
    write_id_maps(directory, raw_items, raw_categories, raw_users)
    return dict(num_items=num_items, num_categories=num_categories, num_users=stats.num_users,
                users=int(len(stats.qualifying)), counts={s: w.count for s, w in writers.items()},
                shards={s: list(w.sizes) for s, w in writers.items()}, store=list(store.sizes),
                clicks_stored=store.count,
                files={**{n: b for w in writers.values() for n, b in w.sizes.items()}, **store.sizes})


def _own_files(directory: str) -> set[str] | None:
    """The entries a dataset that preparation wrote consists of, or None when
    `directory` holds no spec.json of ours."""
    try:
        with open(os.path.join(directory, SPEC_FILE)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    legacy = raw.get("format") is None and {"dataset", "shards", "protocol", "source"} <= set(raw)
    if not (raw.get("format") in (FORMAT, *LEGACY_FORMATS) or legacy):
        return None
    names = {SPEC_FILE, *ID_MAP_FILES.values(), *raw.get("store", [])}
    for shard_names in raw.get("shards", {}).values():
        names.update(shard_names)
    return names


def check_output_dir(output_dir: str, input_path: str) -> None:
    """Raises `OutputDirError` unless `output_dir` may be replaced: it must be
    absent, an empty directory, or a dataset preparation wrote with nothing else
    in it, and must not contain the input log."""
    output_dir = os.path.realpath(output_dir)
    source = os.path.realpath(input_path)
    if os.path.commonpath([output_dir, source]) == output_dir:
        raise OutputDirError(f"--output_dir={output_dir} contains the input log {source}; "
                             "choose a directory of its own for the prepared dataset")
    if not os.path.lexists(output_dir):
        return
    if not os.path.isdir(output_dir):
        raise OutputDirError(f"--output_dir={output_dir} exists and is not a directory; "
                             "remove it or choose another path")
    entries = set(os.listdir(output_dir))
    if not entries:
        return
    own = _own_files(output_dir)
    if own is None:
        raise OutputDirError(
            f"--output_dir={output_dir} is not empty and is not a dataset prepared by dare_tf "
            f"(no {SPEC_FILE} of format {FORMAT!r}); it holds {describe_entries(output_dir)}. "
            "Refusing to replace it: choose an empty or new directory")
    foreign = sorted(entries - own)
    if foreign:
        raise OutputDirError(
            f"--output_dir={output_dir} is a prepared dataset but also holds files preparation did "
            f"not write: {', '.join(repr(e) for e in foreign[:5])}"
            f"{f' and {len(foreign) - 5} more' if len(foreign) > 5 else ''}. "
            "Refusing to replace it: move them away or choose another directory")


def read_log(dataset: str, input_path: str, skip_bad_lines: bool = False) -> Clicks:
    """The click rows of a raw log in the protocol's order (Tmall: time-sorted per user)."""
    if dataset not in FORMATS:
        raise ValueError(f"dataset={dataset!r}: expected one of {sorted(FORMATS)}")
    fmt = FORMATS[dataset]
    start = time.perf_counter()
    clicks = read_clicks(input_path, fmt, skip_bad_lines=skip_bad_lines)
    if clicks.bad_lines:
        logging.warning("%s: skipped %d bad line(s)", input_path, clicks.bad_lines)
    if len(clicks.user) == 0:
        raise ValueError(f"{input_path}: no click rows ({fmt.action} == {fmt.click!r}) in {clicks.rows} rows")
    logging.info("read %d rows, %d clicks in %.1fs", clicks.rows, len(clicks.user), time.perf_counter() - start)
    return time_sorted(clicks) if dataset == "tmall" else clicks


def source_fields(input_path: str, clicks: Clicks) -> dict:
    return dict(path=os.path.abspath(input_path), sha256=clicks.sha256, rows=clicks.rows,
                clicks=int(len(clicks.user)), bad_lines=clicks.bad_lines)


def write_prepared(output_dir: str, input_path: str, build) -> DatasetSpec:
    """Runs `build(staging_directory) -> DatasetSpec` in a staging directory beside
    `output_dir` and renames it into place (see `prepare`); both drivers use it."""
    check_output_dir(output_dir, input_path)
    output_dir = os.path.abspath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    for path in clean_stale(parent, os.path.basename(output_dir)):
        logging.info("removed %s, left by a killed run", path)
    staging = staging_dir(parent, os.path.basename(output_dir))
    try:
        spec = build(staging)
        with open(os.path.join(staging, SPEC_FILE), "w") as f:
            f.write(spec.to_json())
        check_output_dir(output_dir, input_path)  # nothing of the user's appeared meanwhile
        replace_directory(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return spec


def make_spec(dataset: str, protocol: Protocol, source: dict, preparation: str, fields: dict) -> DatasetSpec:
    return DatasetSpec(dataset=dataset, format=FORMAT, max_len=protocol.max_len,
                       protocol=dataclasses.asdict(protocol), source=source, preparation=preparation, **fields)


def prepare(dataset: str, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False) -> DatasetSpec:
    """Raw log -> sequence store, example shards, id maps and spec.json in
    `output_dir`, in memory on one machine (`dare_tf.data.beam.prepare` is the
    same on an Apache Beam runner).

    `output_dir` is replaced only when it is absent, empty, or a dataset that
    preparation wrote (see `check_output_dir`); the new one is built in a
    staging directory beside it and renamed into place. Staging directories
    that a killed run of this function left beside it are removed first.
    """
    if dataset not in FORMATS:
        raise ValueError(f"dataset={dataset!r}: expected one of {sorted(FORMATS)}")
    protocol.validate()
    check_output_dir(output_dir, input_path)
    start = time.perf_counter()
    clicks = read_log(dataset, input_path, skip_bad_lines)
    source = source_fields(input_path, clicks)
    preparation = preparation_id(clicks.sha256, protocol, dataset)
    spec = write_prepared(output_dir, input_path, lambda staging: make_spec(
        dataset, protocol, source, preparation, build_examples(clicks, protocol, staging, preparation)))
    logging.info("wrote %s in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
