"""The paper's sample construction (reference.md, "Data protocol"), vectorised.

From the click rows of a log: dense 1-based ids in order of first appearance,
per-user click sequences, the >= min_clicks user filter, train targets
x_{T-2-stride*j} (j < train_targets), validation target x_{T-1}, test target
x_T, each with the clicks before it as history (most recent max_len, left
padded), and `negatives` negatives per positive drawn by click frequency and
rejected if the user clicked them anywhere in the log. Examples are written
as TFRecord shards of int64 `tf.train.Example`s into a directory that appears
complete or not at all.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import numpy as np
import tensorflow as tf
from absl import logging

from dare_tf._files import clean_stale, describe_entries, replace_directory, staging_dir
from dare_tf.data.codec import encode_int64_examples
from dare_tf.data.logs import FORMATS, Clicks, read_clicks
from dare_tf.data.spec import (FORMAT, HIST_CATEGORIES, HIST_ITEMS, ID_MAP_FILES, LABEL, SPEC_FILE, SPLITS,
                               TARGET_CATEGORY, TARGET_ITEM, USER, DatasetSpec)

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
        max_len: history length L of every example.
        train_targets: train targets per user: x_{T-2-stride*j}, j < train_targets.
        stride: clicks between consecutive train targets.
        negatives: negatives per positive.
        examples_per_shard: examples per TFRecord shard.
    """

    seed: int = 0
    min_clicks: int = 210
    max_len: int = 200
    train_targets: int = 19
    stride: int = 5
    negatives: int = 2
    examples_per_shard: int = 50_000

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
            (self.min_clicks >= earliest + 2, "min_clicks",
             f"must be >= {earliest + 2} so that the earliest train target has a history"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)}: {message}")


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


class _NegativeSampler:
    """Items drawn with probability proportional to click frequency, rejected if
    the user clicked them anywhere in the log."""

    def __init__(self, items: np.ndarray, users: np.ndarray, num_items: int, seed: int):
        freq = np.bincount(items, minlength=num_items)
        self.cdf = np.cumsum(freq)
        self.total = int(self.cdf[-1])
        self.num_items = num_items
        self.clicked = np.unique(users.astype(np.int64) * num_items + items)  # sorted (user, item) keys
        self.rng = np.random.default_rng(seed)
        self.distinct_clicked = np.bincount(self.clicked // num_items)
        self.clickable = int((freq > 0).sum())

    def _draw(self, size: int) -> np.ndarray:
        return np.searchsorted(self.cdf, self.rng.random(size) * self.total, side="right")

    def _clicked(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        keys = users.astype(np.int64) * self.num_items + items
        pos = np.minimum(np.searchsorted(self.clicked, keys), len(self.clicked) - 1)
        return self.clicked[pos] == keys

    def sample(self, users: np.ndarray, per_user: int) -> np.ndarray:
        """[len(users), per_user] negatives; row u holds items user u never clicked."""
        out = np.zeros((len(users), per_user), np.int64)
        filled = np.zeros(len(users), np.int64)
        pending = np.arange(len(users))
        exhausted = users[self.distinct_clicked[users] >= self.clickable]
        if per_user and len(exhausted):
            raise ValueError(f"user with dense id {int(exhausted[0])} clicked every item of the log, "
                             "so no negative can be drawn for it")
        for _ in range(MAX_NEGATIVE_ROUNDS):
            if per_user == 0 or len(pending) == 0:
                return out
            need = per_user - filled[pending]
            draws = int(need.max() * 1.25) + 4
            cand = self._draw(len(pending) * draws).reshape(len(pending), draws)
            ok = ~self._clicked(users[pending][:, None], cand)
            rank = np.cumsum(ok, axis=1) - 1 + filled[pending][:, None]
            take = ok & (rank < per_user)
            rows = np.broadcast_to(pending[:, None], cand.shape)[take]
            out[rows, rank[take]] = cand[take]
            filled[pending] += take.sum(1)
            pending = pending[filled[pending] < per_user]
        raise RuntimeError(f"could not draw {per_user} negatives for {len(pending)} user(s) after "
                           f"{MAX_NEGATIVE_ROUNDS} rounds: they clicked nearly every frequent item")


def _history(items, categories, starts, targets, max_len):
    """Most recent max_len clicks before each target index, left-padded with 0."""
    idx = targets[:, None] - max_len + np.arange(max_len)[None, :]
    valid = idx >= starts[:, None]
    idx = np.where(valid, idx, 0)
    return np.where(valid, items[idx], 0), np.where(valid, categories[idx], 0)


class _ShardWriter:
    """Buffers serialized examples of one split and writes each full shard in
    one call of TF's C++ TFRecord writer (no per-record Python call)."""

    def __init__(self, directory: str, split: str, per_shard: int):
        self.directory, self.split, self.per_shard = directory, split, per_shard
        self.names: list[str] = []
        self.count = 0
        self._pending: list[np.ndarray] = []
        self._pending_count = 0

    def write(self, records: np.ndarray) -> None:
        self._pending.append(records)
        self._pending_count += len(records)
        self.count += len(records)
        while self._pending_count >= self.per_shard:
            self._flush(self.per_shard)

    def _flush(self, size: int) -> None:
        records = np.concatenate(self._pending) if self._pending else np.zeros(0, object)
        shard, rest = records[:size], records[size:]
        self._pending, self._pending_count = ([rest] if len(rest) else []), len(rest)
        name = f"{self.split}-{len(self.names):05d}.tfrecord"
        path = os.path.join(self.directory, name)
        with tf.io.TFRecordWriter(path) as writer:
            for record in shard:
                writer.write(record)
        self.names.append(name)

    def close(self) -> None:
        if self._pending_count or not self.names:  # an empty split still gets one (empty) shard
            self._flush(self._pending_count)


def _write_id_map(path: str, raw_ids: np.ndarray) -> None:
    with open(path, "w") as f:
        f.write("\n".join(map(str, raw_ids.tolist())))
        f.write("\n")


def build_examples(clicks: Clicks, protocol: Protocol, directory: str) -> dict:
    """Writes the shards and id maps of `clicks` into `directory`; returns the
    spec fields that depend on the data."""
    user, raw_users = dense_ids(clicks.user)
    item, raw_items = dense_ids(clicks.item)
    category, raw_categories = dense_ids(clicks.category)
    # The raw-id columns are no longer needed: release them (peak memory).
    clicks.user = clicks.item = clicks.category = clicks.time = None
    user, item, category = user.astype(np.int32), item.astype(np.int32), category.astype(np.int32)
    # Row 0 is padding and the last row is out-of-vocabulary (never trained on;
    # serving maps unknown raw ids there).
    num_items, num_categories = len(raw_items) + 2, len(raw_categories) + 2
    # An item's category is the last one seen for it (the reference overwrites).
    last = len(item) - 1 - np.unique(item[::-1], return_index=True)[1]
    item_category = np.zeros(num_items, np.int64)
    item_category[item[last]] = category[last]
    # Group clicks by user, keeping each user's order (file order or time order).
    order = np.argsort(user, kind="stable")
    seq_items, seq_categories = item[order], category[order]
    lengths = np.bincount(user, minlength=len(raw_users) + 1)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    qualifying = np.nonzero(lengths >= protocol.min_clicks)[0]
    logging.info("%d users, %d qualify (>= %d clicks); %d items, %d categories",
                 len(raw_users), len(qualifying), protocol.min_clicks, len(raw_items), len(raw_categories))
    if len(qualifying) == 0:
        raise ValueError(f"no user has >= {protocol.min_clicks} clicks (the longest history has "
                         f"{int(lengths.max())}); lower --min_clicks or use a larger log")
    # Target offsets from the end of each sequence: train T-2-stride*j (1-based), val T-1, test T.
    offsets = {"train": 3 + protocol.stride * np.arange(protocol.train_targets),
               "val": np.array([2]), "test": np.array([1])}
    sampler = _NegativeSampler(item, user, num_items, protocol.seed)
    writers = {s: _ShardWriter(directory, s, protocol.examples_per_shard) for s in SPLITS}
    per_user = sum(len(o) for o in offsets.values()) * protocol.negatives
    group = 1 + protocol.negatives
    for lo in range(0, len(qualifying), USERS_PER_CHUNK):
        users = qualifying[lo: lo + USERS_PER_CHUNK]
        negatives = sampler.sample(users, per_user)
        used = 0
        for split in SPLITS:
            off = offsets[split]
            ends = starts[users] + lengths[users]
            targets = (ends[:, None] - off[None, :]).reshape(-1)  # [U * n]
            owner = np.repeat(users, len(off))
            hist_i, hist_c = _history(seq_items, seq_categories, np.repeat(starts[users], len(off)),
                                      targets, protocol.max_len)  # one history per target
            neg = negatives[:, used: used + len(off) * protocol.negatives].reshape(-1, protocol.negatives)
            used += len(off) * protocol.negatives
            # Each target gives [positive, negative_1, ..., negative_n], in that order.
            target_items = np.concatenate([seq_items[targets][:, None], neg], 1).reshape(-1)
            records = encode_int64_examples({
                USER: np.repeat(owner, group),
                TARGET_ITEM: target_items,
                TARGET_CATEGORY: np.where(
                    np.arange(len(target_items)) % group == 0,
                    seq_categories[np.repeat(targets, group)], item_category[target_items]),
                LABEL: np.tile(np.eye(1, group, dtype=np.int64)[0], len(targets)),
            }, shared={HIST_ITEMS: hist_i, HIST_CATEGORIES: hist_c}, group=group)
            writers[split].write(records)
        logging.info("users %d/%d", min(lo + USERS_PER_CHUNK, len(qualifying)), len(qualifying))
    for w in writers.values():
        w.close()
    _write_id_map(os.path.join(directory, ID_MAP_FILES["item"]), raw_items)
    _write_id_map(os.path.join(directory, ID_MAP_FILES["category"]), raw_categories)
    _write_id_map(os.path.join(directory, ID_MAP_FILES["user"]), raw_users)
    return dict(num_items=num_items, num_categories=num_categories, num_users=len(raw_users) + 1,
                users=int(len(qualifying)), counts={s: w.count for s, w in writers.items()},
                shards={s: w.names for s, w in writers.items()})


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
    if not isinstance(raw, dict) or not (raw.get("format") == FORMAT or legacy):
        return None
    names = {SPEC_FILE, *ID_MAP_FILES.values()}
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


def prepare(dataset: str, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False) -> DatasetSpec:
    """Raw log -> TFRecord shards, id maps and spec.json in `output_dir`.

    `output_dir` is replaced only when it is absent, empty, or a dataset that
    preparation wrote (see `check_output_dir`); the new one is built in a
    staging directory beside it and renamed into place. Staging directories
    that a killed run of this function left beside it are removed first.
    """
    if dataset not in FORMATS:
        raise ValueError(f"dataset={dataset!r}: expected one of {sorted(FORMATS)}")
    protocol.validate()
    check_output_dir(output_dir, input_path)
    fmt = FORMATS[dataset]
    start = time.perf_counter()
    clicks = read_clicks(input_path, fmt, skip_bad_lines=skip_bad_lines)
    n_clicks = int(len(clicks.user))
    if clicks.bad_lines:
        logging.warning("%s: skipped %d bad line(s)", input_path, clicks.bad_lines)
    if n_clicks == 0:
        raise ValueError(f"{input_path}: no click rows ({fmt.action} == {fmt.click!r}) in {clicks.rows} rows")
    logging.info("read %d rows, %d clicks in %.1fs", clicks.rows, n_clicks, time.perf_counter() - start)
    if dataset == "tmall":
        clicks = time_sorted(clicks)
    output_dir = os.path.abspath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    for path in clean_stale(parent, os.path.basename(output_dir)):
        logging.info("removed %s, left by a killed run", path)
    staging = staging_dir(parent, os.path.basename(output_dir))
    try:
        fields = build_examples(clicks, protocol, staging)
        spec = DatasetSpec(
            dataset=dataset, format=FORMAT, max_len=protocol.max_len, protocol=dataclasses.asdict(protocol),
            source=dict(path=os.path.abspath(input_path), sha256=clicks.sha256, rows=clicks.rows,
                        clicks=n_clicks, bad_lines=clicks.bad_lines),
            **fields)
        with open(os.path.join(staging, SPEC_FILE), "w") as f:
            f.write(spec.to_json())
        check_output_dir(output_dir, input_path)  # nothing of the user's appeared meanwhile
        replace_directory(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logging.info("wrote %s in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
