"""The in-memory driver of the preparation protocol (`dare_tf.data.preparation.protocol`):
the whole log read into numpy arrays on one machine, then the store, the example
shards, the id maps and spec.json written (`prepare`)."""

from __future__ import annotations

import time

import numpy as np
from absl import logging

from dare_tf._faces import public
from dare_tf.data.preparation.days import LogRows, build_time_split
from dare_tf.data.preparation.examples import (USERS_PER_CHUNK, LogStatistics, UserRows,
    chunk_examples, qualifying_users, store_rows)
from dare_tf.data.logs.formats import LogFormat
from dare_tf.data.logs.clicks import Clicks, dense_ids
from dare_tf.data.preparation.dataset_dir import guard_dataset_dir, write_prepared
from dare_tf.data.preparation.prepared import (PartitionedWriter, allow_open_files, check_compression,
                                   layout_fields, log_format, make_spec, source_fields, write_field_maps,
                                   write_id_maps, write_item_clicks)
from dare_tf.data.storage.fields import DenseFields, last_rows, spec_fields
from dare_tf.data.logs.reader import MAX_BAD_SHARE, read_log
from dare_tf.data.storage.spec import SPLITS, DatasetSpec
from dare_tf.data.storage.shards import STORE_KIND

from dare_tf.data.preparation.protocol import (Protocol, no_user_qualifies, preparation_id, time_windows,
                                              users_by_clicks)


def build_examples(clicks: Clicks, protocol: Protocol, directory: str, compression: str,
                   fmt: LogFormat | None = None) -> dict:
    """Writes the store, the example shards and the id maps of `clicks` into
    `directory`; returns the spec fields that depend on the data."""
    user, raw_users = dense_ids(clicks.user)
    item, raw_items = dense_ids(clicks.item)
    category, raw_categories = dense_ids(clicks.category)
    # (`--string_ids`: the codes' strings, as the id maps hold them)
    raw_users, raw_items, raw_categories = (clicks.raw(role, raw) for role, raw in (
        ("user", raw_users), ("item", raw_items), ("category", raw_categories)))
    labels, times = clicks.label, clicks.time
    impressions = labels is not None
    bounds = protocol.bounds(int(times.max())) if protocol.split == "time" else None
    # Row 0 is padding and the last row is out-of-vocabulary (never trained on;
    # serving maps unknown raw ids there).
    num_items, num_categories = len(raw_items) + 2, len(raw_categories) + 2
    fields = DenseFields(clicks.fields, item, num_items)
    fields.raw = {name: clicks.raw(name, raw) for name, raw in fields.raw.items()}
    field_entries = spec_fields(fields.entries(fmt), protocol.time_gap)
    # `--action_field`: every action is history, the clicks among them are the targets.
    clicked = clicks.clicked() if clicks.click_code is not None else None
    # The raw-id columns are no longer needed: release them (peak memory).
    clicks.user = clicks.item = clicks.category = clicks.time = clicks.label = None
    clicks.fields = {}
    user, item, category = user.astype(np.int32), item.astype(np.int32), category.astype(np.int32)
    item_category = _last_category(item, category, num_items)
    if bounds is not None:
        return _time_split(directory, user, item, category, times, labels, (raw_items, raw_categories, raw_users),
                           item_category, protocol, bounds, compression, fields, field_entries, clicked)
    is_click = clicked if clicked is not None else np.ones(len(user), bool) if not impressions else labels == 1
    rows_per_user = np.bincount(user, minlength=len(raw_users) + 1)
    clicks_per_user = np.bincount(user[is_click], minlength=len(raw_users) + 1)
    stats = LogStatistics(item_category=item_category,
                          item_cdf=np.cumsum(np.bincount(item[is_click], minlength=num_items)),
                          qualifying=qualifying_users(clicks_per_user, rows_per_user if impressions else None,
                                                      protocol),
                          num_users=len(raw_users) + 1, item_fields=fields.of_item)
    logging.info("%d users, %d qualify (>= %d clicks); %d items, %d categories", len(raw_users),
                 len(stats.qualifying), protocol.min_clicks, len(raw_items), len(raw_categories))
    if len(stats.qualifying) == 0:
        raise no_user_qualifies(protocol, int(clicks_per_user.max()), impressions)
    # Only the qualifying users' rows, grouped by user in their order (file or time order).
    order = _rows_of(user, stats.qualifying, len(raw_users) + 1)
    seq = {"items": item[order], "categories": category[order], "times": times[order]}  # (the store keeps times)
    if impressions:
        seq["labels"] = labels[order]
    if clicked is not None:
        seq["clicked"] = clicked[order]
    seq_fields = {name: values[order] for name, values in fields.values.items()}
    del order, user, item, category, times, labels
    files = _write_users(directory, seq, seq_fields, rows_per_user[stats.qualifying], stats, protocol, compression)
    write_id_maps(directory, raw_items, raw_categories, raw_users, stats.item_category)
    write_field_maps(directory, fields.raw, fields.of_item, num_items)
    return dict(num_items=num_items, num_categories=num_categories, num_users=stats.num_users,
                users=int(len(stats.qualifying)), **layout_fields(protocol, compression, files, fields=field_entries),
                **time_windows(protocol, bounds), users_by_clicks=users_by_clicks(clicks_per_user[1:]))


def _last_category(item: np.ndarray, category: np.ndarray, num_items: int) -> np.ndarray:
    """Each item's category: its last row's (0 for the padding and out-of-vocabulary rows)."""
    last = last_rows(item)
    item_category = np.zeros(num_items, np.int32)
    item_category[item[last]] = category[last]
    return item_category


def _rows_of(user: np.ndarray, users: np.ndarray, num_users: int) -> np.ndarray:
    """The rows of `users`, grouped by user in ascending dense id, each user's in
    their order in the log."""
    keep = np.zeros(num_users, bool)
    keep[users] = True
    keep = keep[user]
    return np.flatnonzero(keep)[np.argsort(user[keep], kind="stable")]


def _write_users(directory: str, seq: dict, seq_fields: dict, lengths: np.ndarray, stats: LogStatistics,
                 protocol: Protocol, compression: str) -> dict:
    """Writes the qualifying users' examples and store records (`seq`, `seq_fields`:
    their rows' columns, user after user, `lengths` rows each) by chunks of
    users; returns the written files."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    allow_open_files(4 * protocol.partitions, protocol.partitions)
    writers = {kind: PartitionedWriter(directory, kind, protocol.partitions, compression)
               for kind in (*SPLITS, STORE_KIND)}
    for chunk, users in stats.chunks():
        lo = chunk * USERS_PER_CHUNK
        spans = [slice(starts[lo + i], starts[lo + i] + lengths[lo + i]) for i in range(len(users))]
        rows = [UserRows(**{k: v[s] for k, v in seq.items()}, fields={k: v[s] for k, v in seq_fields.items()})
                for s in spans]
        for split, columns in chunk_examples(chunk, users, rows, stats, protocol).items():
            writers[split].write_examples(columns)
        writers[STORE_KIND].write_store(*store_rows(users, [r.stored() for r in rows]))
        logging.info("users %d/%d", lo + len(users), len(stats.qualifying))
    files = {}
    for w in writers.values():
        files.update(w.close())
    return files


def _time_split(directory, user, item, category, times, labels, raw, item_category, protocol, bounds,
                compression, fields, field_entries, clicked=None) -> dict:
    """`build_examples` of a `--split=time` log (`dare_tf.data.preparation.days`)."""
    raw_items, raw_categories, raw_users = raw
    is_click = clicked if clicked is not None else np.ones(len(user), bool) if labels is None else labels == 1
    clicks_per_user = np.bincount(user[is_click], minlength=len(raw_users) + 1)
    if clicks_per_user.max() < max(protocol.min_clicks, 1):
        raise no_user_qualifies(protocol, int(clicks_per_user.max()))
    allow_open_files(2 * protocol.partitions, protocol.partitions)
    rows = LogRows(user, item, category, times, labels, fields.values, clicked)
    files, users, item_clicks = build_time_split(directory, rows, len(raw_users) + 1, len(raw_items) + 2, protocol,
                                                 bounds, compression)
    write_id_maps(directory, raw_items, raw_categories, raw_users, item_category)
    write_field_maps(directory, fields.raw, fields.of_item, len(raw_items) + 2)
    write_item_clicks(directory, item_clicks)
    return dict(num_items=len(raw_items) + 2, num_categories=len(raw_categories) + 2, num_users=len(raw_users) + 1,
                users=users, users_by_clicks=users_by_clicks(clicks_per_user[1:]),
                **layout_fields(protocol, compression, files, bounds, field_entries),
                **time_windows(protocol, bounds))


@public("dare_tf.data")
def prepare(log: str | LogFormat, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False, compression: str = "GZIP",
            max_bad_share: float = MAX_BAD_SHARE) -> DatasetSpec:
    """Raw log -> sequence store, example shards, id maps and spec.json in
    `output_dir`, in memory on one machine (`dare_tf.data.preparation.beam.prepare` is the
    same on an Apache Beam runner).

    Args:
        log: a preset's name (`taobao`, `tmall`) or a `LogFormat`.
        compression: `GZIP` or `""` (uncompressed TFRecord files).
        skip_bad_lines: skip and count malformed lines instead of raising;
            more than `max_bad_share` of the log's lines is refused
            (`dare_tf.data.logs.reader.check_bad_share`).

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
    clicks = read_log(input_path, fmt, skip_bad_lines, chronological=protocol.split == "time",
                      max_bad_share=max_bad_share)
    source = source_fields(input_path, clicks, fmt)
    if protocol.split == "time":  # where a day can be appended (dare_tf.data.preparation.append)
        source["last_time"] = int(clicks.time.max())
    preparation = preparation_id(clicks.sha256, protocol, fmt, compression)
    spec = write_prepared(output_dir, input_path, lambda staging: make_spec(
        fmt, protocol, source, preparation, build_examples(clicks, protocol, staging, compression, fmt)))
    logging.info("wrote %s in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
