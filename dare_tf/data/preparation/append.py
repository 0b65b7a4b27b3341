"""A new day's log appended to a `--split=time` dataset (`data.prepare --append`).

Old raw ids keep their dense ids and new ones get the next (in order of first
appearance in time, as a preparation of all the days at once numbers them);
the day's examples are written as new segment shards (`dare_tf.data.preparation.days`);
the store shards of the partitions whose users have rows that day are
rewritten with their users' new clicks, the others are kept. The result is
the dataset that preparing all the days at once writes, record for record.

What the append costs is the new day's rows, the id maps and the store
shards it rewrites; the old days' examples are not read.

The commit is journaled (`dare_tf.data.preparation.journal`): a killed append
leaves the dataset as it was (its new files are removed by the next append);
one killed during the renames is finished by the next append, and until then
the dataset is refused when read (`DatasetSpec.load`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

import numpy as np
from absl import logging

from dare_tf._files import one_writer
from dare_tf.data.preparation.catalogue import Catalogue, day_name
from dare_tf.data.preparation.days import LogRows, Past, write_days, write_store
from dare_tf.data.storage.fields import field_id_file
from dare_tf.data.logs.reader import MAX_BAD_SHARE, read_log
from dare_tf.data.logs.formats import ACTION_FIELD, LogFormat
from dare_tf.data.logs.clicks import dense_ids
from dare_tf.data.preparation import journal
from dare_tf.data.preparation.dataset_dir import verify_tables
from dare_tf.data.preparation.prepared import (item_categories, layout_fields, make_spec, read_item_clicks,
    read_item_field)
from dare_tf.data.preparation.protocol import Protocol, time_windows
from dare_tf.data.storage.records import read_shards
from dare_tf.data.storage.spec import APPEND_JOURNAL, SPEC_FILE, DatasetSpec
from dare_tf.data.storage.id_maps import read_id_file, read_id_map
from dare_tf.data.storage.shards import STORE_KIND, partition_of
from dare_tf.data.storage.schema import STORE_TIMES
from dare_tf.data.logs.times import DAY


def _extend_ids(raw: np.ndarray, known: list[str], strings: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids of `raw` under the map `known` (raw ids in dense order), new raw
    ids numbered after it in order of first appearance; and the extended map
    (`strings`: `--string_ids`, the ids are the strings themselves)."""
    known_ids = np.array(known, object) if strings else np.array([int(r) for r in known], np.int64)
    order = np.argsort(known_ids)
    pos = np.minimum(np.searchsorted(known_ids[order], raw), max(len(known_ids) - 1, 0))
    found = (known_ids[order][pos] == raw) if len(known_ids) else np.zeros(len(raw), bool)
    dense = np.zeros(len(raw), np.int64)
    dense[found] = order[pos[found]] + 1
    new_dense, new_raw = dense_ids(raw[~found])
    dense[~found] = len(known_ids) + new_dense
    return dense, np.concatenate([known_ids, new_raw])


def _check(spec: DatasetSpec, data_dir: str, fmt: LogFormat | None, input_path: str) -> LogFormat:
    if spec.protocol.get("split") != "time":
        raise ValueError(f"--append: {data_dir} was prepared with --split=user (the paper's per-user protocol); "
                         "a day can be appended to a --split=time dataset only: prepare it with --split=time")
    if "last_time" not in spec.source:
        raise ValueError(f"--append: {data_dir} was prepared before --append existed (spec.json has no "
                         "source.last_time); prepare it again")
    own = LogFormat.from_json(spec.source["log"])
    if fmt is not None and fmt != own:
        differ = [k for k, v in fmt.to_json().items() if own.to_json()[k] != v]
        raise ValueError(f"--append: {input_path} is read as {fmt.name!r} with {differ[0]}={fmt.to_json()[differ[0]]}"
                         f", but {data_dir} holds a {own.name!r} log with {differ[0]}={own.to_json()[differ[0]]}; "
                         "append a log of the dataset's format and fields (or give no format flags)")
    return own


def append(input_path: str, data_dir: str, fmt: LogFormat | None = None, allow_late: bool = False,
           skip_bad_lines: bool = False, timings: dict | None = None, read: dict | None = None,
           max_bad_share: float = MAX_BAD_SHARE) -> DatasetSpec:
    """Appends the day(s) of `input_path` to the `--split=time` dataset in
    `data_dir` (see the module docstring); returns the new spec.

    Args:
        fmt: the log's format; None: the dataset's (given, it must be the dataset's).
        allow_late: rows on or before the dataset's last day are dropped (and
            counted in spec.json's `source.appended`) instead of refused: such a
            day is in the dataset already, and its examples are not rewritten.
        timings: filled with the seconds of each phase (`read_log`,
            `read_store`, `examples`, `write_store`, `commit`).
        read: filled with the rows read (`read["clicks"]`, `Clicks` in time
            order, late ones included), for a caller that appends the same
            day elsewhere (`data.prepare --histories`) without parsing it again.

    Appending a log whose sha256 the dataset already holds does nothing (the
    re-run of an append that was killed after its commit). One append at a
    time: another writer of the dataset (an append, or a whole preparation
    into it) is refused (`dare_tf._files.one_writer`).
    """
    if not os.path.exists(os.path.join(data_dir, SPEC_FILE)) and not os.path.exists(
            os.path.join(data_dir, APPEND_JOURNAL)):
        raise FileNotFoundError(f"--append: {os.path.join(data_dir, SPEC_FILE)} not found: --output_dir must be a "
                                "dataset prepared with --split=time")
    with one_writer(data_dir, "data.prepare --append"):
        return _append(input_path, data_dir, fmt, allow_late, skip_bad_lines, max_bad_share,
                       {} if timings is None else timings, {} if read is None else read)


@dataclasses.dataclass
class _NewRows:
    """The appended rows in dense ids (old raw ids keep theirs, new ones get the
    next), the extended id maps, and the catalogue grown to the new ids as of
    the dataset's last day."""

    rows: LogRows
    raw_users: np.ndarray
    raw_items: np.ndarray
    raw_categories: np.ndarray
    raw_fields: dict
    catalogue: Catalogue

    @property
    def num_items(self) -> int:
        return len(self.raw_items) + 2

    @property
    def num_users(self) -> int:
        return len(self.raw_users) + 1


def _new_rows(data_dir: str, spec: DatasetSpec, fmt: LogFormat, clicks, keep: np.ndarray) -> _NewRows:
    # (`--string_ids`: the codes' strings, as the id maps hold them)
    raw = {k: clicks.raw(k, getattr(clicks, k)[keep]) for k in ("user", "item", "category")}
    strings = fmt.string_ids
    user, raw_users = _extend_ids(raw["user"], read_id_map(data_dir, "user"), strings)
    item, raw_items = _extend_ids(raw["item"], read_id_map(data_dir, "item"), strings)
    category, raw_categories = _extend_ids(raw["category"], read_id_map(data_dir, "category"),
                                           strings and "category" in fmt.role_columns)
    names = spec.field_schema.columns
    fields, raw_fields = {}, {}
    for name in names:
        fields[name], raw_fields[name] = _extend_ids(clicks.raw(name, clicks.fields[name][keep]),
                                                     read_id_file(os.path.join(data_dir, field_id_file(name))),
                                                     strings and name != ACTION_FIELD)
    grown = np.zeros(len(raw_items) + 2, np.int64)  # the catalogue as of the dataset's last day, grown by new ids
    catalogue = Catalogue(grown, grown, dict.fromkeys(names, grown))
    old = spec.num_items - 1
    catalogue.categories[:old] = item_categories(data_dir, spec, lambda: [])[:old]
    catalogue.counts[:old] = read_item_clicks(data_dir, spec.num_items)[:old]
    for name in names:
        if not spec.field(name)["history_only"]:
            catalogue.fields[name][:old] = read_item_field(data_dir, spec, name)[:old]
    rows = LogRows(user, item, category, clicks.time[keep], None if clicks.label is None else clicks.label[keep],
                   fields, clicks.clicked()[keep] if fmt.action_field else None)
    return _NewRows(rows, raw_users, raw_items, raw_categories, raw_fields, catalogue)


@dataclasses.dataclass
class _OldStore:
    """The stored users of the partitions the new rows touch: their lists and click counts."""

    partitions: list
    lists: dict

    @classmethod
    def read(cls, data_dir: str, spec: DatasetSpec, fmt: LogFormat, new: _NewRows, protocol: Protocol) -> "_OldStore":
        partitions = np.unique(partition_of(new.rows.uid, protocol.partitions)).tolist()
        names = ("uid", "length", *spec.record_columns[1])  # items, categories, the fields' and the times
        shards = read_shards(data_dir, [spec.store[k] for k in partitions], spec, STORE_KIND)
        store = cls(partitions, dict(zip(names, _concat(shards, names))))
        store._start = dict(zip(store.lists["uid"].tolist(),
                                np.concatenate([[0], np.cumsum(store.lists["length"])[:-1]]).tolist()))
        store._length = dict(zip(store.lists["uid"].tolist(), store.lists["length"].tolist()))
        # `--action_field`: every action is history, the clicks among them are the targets (and qualify a user).
        clicked = np.ones(len(store.lists["items"]), bool)
        if fmt.action_field:
            click_code = int(np.flatnonzero(new.raw_fields[ACTION_FIELD] == fmt.click_code)[0]) + 1
            clicked = store.lists[ACTION_FIELD] == click_code
        counted = np.bincount(np.repeat(store.lists["uid"], store.lists["length"])[clicked], minlength=new.num_users)
        store._clicks = dict(zip(store.lists["uid"].tolist(), counted[store.lists["uid"]].tolist()))
        return store

    def history(self, uid: int) -> np.ndarray:
        start = self._start.get(uid)
        return (self.lists["items"][start: start + self._length[uid]].astype(np.int64) if start is not None
                else np.zeros(0, np.int64))

    def clicks(self, uid: int) -> int:
        return self._clicks.get(uid, 0)

    def write_grown(self, data_dir: str, spec: DatasetSpec, new: _NewRows, protocol: Protocol) -> dict:
        """Rewrites the touched partitions' store shards with the new clicks appended; their files."""
        old, rows = self.lists, new.rows
        is_click = rows.is_click  # (the history's rows)
        click_uid = np.concatenate([np.repeat(old["uid"], old["length"]), rows.uid[is_click]]).astype(np.int64)
        source = np.concatenate([np.zeros(len(old["items"]), np.int64), np.ones(int(is_click.sum()), np.int64)])
        order = np.lexsort((np.arange(len(click_uid)), source, click_uid))
        users = np.union1d(old["uid"], rows.uid)
        lengths = np.bincount(click_uid, minlength=new.num_users)[users]
        added = {"items": rows.items, "categories": rows.categories, **rows.fields, STORE_TIMES: rows.times}
        merged = {k: np.concatenate([old[k], added[k][is_click]])[order] for k in spec.record_columns[1]}
        return write_store(data_dir, users, lengths, merged.pop("items"), merged.pop("categories"), protocol,
                           spec.compression, int(rows.times.max()), indices=self.partitions, extra=merged)

    def qualified(self, new: _NewRows, protocol: Protocol) -> int:
        """Users that reach `min_clicks` with the new rows."""
        users = np.union1d(self.lists["uid"], new.rows.uid)
        before = np.array([self.clicks(u) for u in users.tolist()])
        after = before + np.bincount(new.rows.uid[new.rows.popular], minlength=new.num_users)[users]
        return int(((before < protocol.min_clicks) & (after >= protocol.min_clicks)).sum())


def _late(spec: DatasetSpec, clicks, input_path: str, allow_late: bool) -> np.ndarray:
    """The rows on or before the dataset's last day: refused, or (`allow_late`) to be dropped."""
    last_day = int(spec.source["last_time"]) // DAY
    late = clicks.time // DAY <= last_day
    if late.any() and not allow_late:
        first = int(np.flatnonzero(late)[0])
        raise ValueError(f"--append: {input_path}: {int(late.sum())} of its {len(late)} rows are on or before "
                         f"{day_name(last_day)}, the dataset's last day (the first at time {int(clicks.time[first])})"
                         "; a day is appended once, after the days the dataset holds (pass --allow_late to drop "
                         "those rows)")
    if late.all():
        raise ValueError(f"--append: {input_path}: every row is on or before {day_name(last_day)}, the dataset's "
                         "last day; nothing is left to append")
    return late


def _append(input_path: str, data_dir: str, fmt: LogFormat | None, allow_late: bool, skip_bad_lines: bool,
            max_bad_share: float, timings: dict, read: dict) -> DatasetSpec:
    start = time.perf_counter()
    mark = [start]

    def phase(name):
        now = time.perf_counter()
        timings[name] = timings.get(name, 0.0) + now - mark[0]
        mark[0] = now

    journal.recover(data_dir)
    spec = DatasetSpec.load(data_dir)
    verify_tables(data_dir, spec)  # (the new days are mapped through them)
    fmt = _check(spec, data_dir, fmt, input_path)
    protocol = Protocol(**{k: v for k, v in spec.protocol.items() if k != "windows"})
    clicks = read_log(input_path, fmt, skip_bad_lines, chronological=True, max_bad_share=max_bad_share)
    read["clicks"] = clicks
    phase("read_log")
    appended = spec.source.get("appended", [])
    if clicks.sha256 in {spec.source["sha256"], *(a["sha256"] for a in appended)}:
        logging.warning("%s: this log (sha256 %s...) is in %s already; nothing to append", input_path,
                        clicks.sha256[:16], data_dir)
        return spec
    late = _late(spec, clicks, input_path, allow_late)
    new = _new_rows(data_dir, spec, fmt, clicks, ~late)
    bounds = protocol.bounds(int(new.rows.times.max()))
    store = _OldStore.read(data_dir, spec, fmt, new, protocol)
    phase("read_store")
    before = set(os.listdir(data_dir))
    try:
        files = {n: e for n, e in spec.files.items() if n not in {spec.store[k] for k in store.partitions}}
        files.update(write_days(data_dir, new.rows, Past(new.catalogue, store.history, store.clicks), protocol, bounds,
                                spec.compression))
        phase("examples")
        files.update(store.write_grown(data_dir, spec, new, protocol))
        phase("write_store")
        entry = dict(path=os.path.abspath(input_path), sha256=clicks.sha256, rows=clicks.rows,
                     clicks=int(new.rows.popular.sum()), bad_lines=clicks.bad_lines, late_rows=int(late.sum()))
        new_source = {**spec.source, "appended": [*appended, entry], "last_time": int(new.rows.times.max())}
        preparation = hashlib.sha256(f"{spec.preparation}+{clicks.sha256}+{allow_late}".encode()).hexdigest()[:16]
        new_spec = make_spec(fmt, protocol, new_source, preparation, dict(
            num_items=new.num_items, num_categories=len(new.raw_categories) + 2, num_users=new.num_users,
            users=spec.users + store.qualified(new, protocol),
            **layout_fields(protocol, spec.compression, files, bounds, [
                dict(f, vocabulary=len(new.raw_fields[f["name"]]) + 2) if f["name"] in new.raw_fields else f
                for f in spec.fields], spec.store_times), **time_windows(protocol, bounds)))
    except BaseException:  # (refused or killed before the journal: the new shards this append wrote go)
        for name in set(os.listdir(data_dir)) - before:
            if name.endswith(".tfrecord.gz") or name.endswith(".tfrecord"):
                os.remove(os.path.join(data_dir, name))
        raise
    new_spec = journal.write_journal(data_dir, new_spec, new)
    journal.commit(data_dir)
    phase("commit")
    logging.info("appended %s to %s in %.1fs: %s", input_path, data_dir, time.perf_counter() - start, new_spec.counts)
    return new_spec


def _concat(parts: list[dict], keys) -> tuple[np.ndarray, ...]:
    if not parts:
        return tuple(np.zeros(0, np.int64) for _ in keys)
    return tuple(np.concatenate([p[k] for p in parts]).astype(np.int64) for k in keys)

