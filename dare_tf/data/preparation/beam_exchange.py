"""The files through which the Beam driver's steps hand each other a log's rows
(`dare_tf.data.preparation.beam`).

A runner's shuffle and side inputs carry only file names, counts and
per-id summaries, never a row: the DirectRunner keeps every grouped
collection and every side input in its driver process, so a log's rows
grouped through it would have to fit there (at 100M rows, more than a
24 GB machine holds). Instead each step writes what the next one reads into
the work directory (`work_dir`, inside the staging directory, so on a
cluster a file system every worker reaches, as the output already is):

1. each parsed block, its rows cut into user buckets (`by_bucket`: a user's
   rows all land in one bucket, whichever block they come from);
2. each bucket's rows from every block, sorted by user and, within a user,
   into the protocol's order (`sorted_bucket`);
3. each bucket's per-id summaries, cut by id (`hash_buckets`) so that each
   cut is merged over every bucket by one worker;
4. the whole log's statistics and every raw id's dense id, loaded once per
   worker process (`shared`).

Files are written under a temporary name and renamed, so that a retried
bundle rewrites them whole; the work directory goes with the staging
directory.
"""

from __future__ import annotations

import functools
import os
import pickle

import numpy as np
from absl import logging

from dare_tf.data.preparation.prepared import MAX_BUCKETS

WORK_DIR = ".beam-work"


def work_dir(staging: str) -> str:
    path = os.path.join(staging, WORK_DIR)
    os.makedirs(path, exist_ok=True)
    return path


def put(path: str, value) -> str:
    """Writes `value` (pickled) at `path`, whole or not at all; returns `path`."""
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def get(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def put_rows(path: str, rows: dict[str, np.ndarray]) -> str:
    """`put` of integer columns, each in its narrowest type (`compact`)."""
    return put(path, compact(rows))


def get_rows(path: str) -> dict[str, np.ndarray]:
    """The columns `put_rows` wrote, as int64."""
    return widen(get(path))


def get_bucket(path: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A sorted bucket's rows and where each user's start (`Steps.sort_bucket`)."""
    rows = get_rows(path)
    return rows, rows.pop("starts")


def shared(path: str):
    """`get(path)` once per process (the statistics every bundle of a step reads)."""
    stat = os.stat(path)
    return _shared(path, stat.st_mtime_ns, stat.st_size)


def forget_shared() -> None:
    """Drops what `shared` holds (a runner whose workers are threads of this
    process would otherwise keep the last pipeline's statistics)."""
    _shared.cache_clear()


@functools.lru_cache(maxsize=4)
def _shared(path: str, _mtime: int, _size: int):
    return get(path)


def block_rows(block_index: int, clicks) -> dict[str, np.ndarray]:
    """A parsed block's rows (raw ids): `key` (block << 32 | row in block), `user`,
    `item`, `category`, `time`, `label` (an impression's label; 1 where a click
    log's row is a click) and `fields`: `[rows, F]` the further fields' raw ids,
    in the order of `clicks.fields`."""
    n = len(clicks.user)
    labels = clicks.label if clicks.label is not None else clicks.clicked().astype(np.int64)
    fields = (np.stack([clicks.fields[name] for name in clicks.fields], 1) if clicks.fields
              else np.zeros((n, 0), np.int64))
    return {"key": (np.int64(block_index) << 32) + np.arange(n, dtype=np.int64), "user": clicks.user,
            "item": clicks.item, "category": clicks.category, "time": clicks.time, "label": labels,
            "fields": fields}


def hash_buckets(ids: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each raw id (users' rows, summaries' ids): a multiplicative
    hash, so that buckets are even whatever the ids' spacing."""
    mixed = np.asarray(ids, np.int64).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(33)) % np.uint64(buckets)).astype(np.int64)


def split_by(which: np.ndarray, parts: int) -> list[np.ndarray]:
    """The indices of `which` (values below `parts`) with each value, in order:
    one sort, not a pass per part."""
    order = np.argsort(which, kind="stable")
    return np.split(order, np.searchsorted(which[order], np.arange(1, parts)))


def by_bucket(rows: dict[str, np.ndarray], buckets: int):
    """`(bucket, its rows)` of each bucket that has rows, in bucket order."""
    for j, part in enumerate(split_by(hash_buckets(rows["user"], buckets), buckets)):
        if len(part):
            yield j, {name: column[part] for name, column in rows.items()}


def sorted_bucket(parts: list[dict], by_time: bool) -> tuple[dict, np.ndarray]:
    """One bucket's rows from every block (`parts`, int64), sorted by raw user and each
    user's rows into protocol order (file order, or stably by time: `by_time`);
    and where each user's rows start."""
    rows = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    order = (np.lexsort((rows["key"], rows["time"], rows["user"])) if by_time
             else np.lexsort((rows["key"], rows["user"])))
    rows = {name: column[order] for name, column in rows.items()}
    return rows, group_starts(rows["user"])


def compact(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each integer column in the narrowest type that holds its values (the
    files' size: a log's rows pass through two of them); `widen` undoes it."""
    out = {}
    for name, column in rows.items():
        low, high = (int(column.min()), int(column.max())) if column.size else (0, 0)
        out[name] = column.astype(next(t for t in (np.int8, np.int16, np.int32, np.int64)
                                       if np.iinfo(t).min <= low and high <= np.iinfo(t).max))
    return out


def widen(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: column.astype(np.int64) for name, column in rows.items()}


def group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """Where each run of equal values of `sorted_ids` starts."""
    if len(sorted_ids) == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.concatenate([[True], sorted_ids[1:] != sorted_ids[:-1]]))


def lengths(starts: np.ndarray, total: int) -> np.ndarray:
    """The length of each run that starts at `starts` (of `total` rows)."""
    return np.diff(np.append(starts, total))


# `--beam_buckets`: at most `MAX_BUCKETS` (as `--partitions`), and at most one per
# `BUCKET_MIN_BYTES` of log: each bucket is a work file per block and step, so a
# bucket count far past the log's size only writes empty files (20,000 buckets of a
# 447 KB log wrote 715,535 files and ran past 240 s; 3 took 7 s).
BUCKET_MIN_BYTES = 16 * 1024


def bucket_count(input_path: str, plan, asked: int | None) -> int:
    """The user buckets of a run: `asked` (refused above `MAX_BUCKETS`, capped by the
    log's size with a warning), or `default_buckets`."""
    if asked is None:
        return default_buckets(input_path, plan)
    if not 1 <= asked <= MAX_BUCKETS:
        raise ValueError(f"buckets={asked}: expected 1 to {MAX_BUCKETS}")
    size = os.path.getsize(input_path)
    cap = max(1, size // BUCKET_MIN_BYTES)
    if asked > cap:
        logging.warning("--beam_buckets=%d: capped at %d, one bucket per %d KiB of the log (%s: %d bytes)", asked,
                        cap, BUCKET_MIN_BYTES // 1024, input_path, size)
        return cap
    return asked


def default_buckets(input_path: str, plan) -> int:
    """One user bucket per `BLOCK_BYTES` of log, at most one per block."""
    from dare_tf.data.logs.reader import BLOCK_BYTES

    return max(1, min(len(plan.blocks), -(-os.path.getsize(input_path) // BLOCK_BYTES)))
