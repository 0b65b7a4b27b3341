"""What a prepared dataset's files hold: the partitioned shard writer, the id
maps and item tables, and the spec's layout fields. Both preparation drivers
(`dare_tf.data.preparation.protocol`, in memory, and `dare_tf.data.preparation.beam`) use it; the
directory as a whole (its guard, its one writer, the staged write, its
tables' digests) is `dare_tf.data.preparation.dataset_dir`'s."""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from dare_tf._faces import public
from dare_tf.data.logs.times import utc_time
from dare_tf.data.logs.formats import ACTION_FIELD, FORMATS, LogFormat
from dare_tf.data.logs.clicks import Clicks
from dare_tf.data.storage.records import ShardWriter
from dare_tf.data.storage.wire import encode_examples, encode_store
from dare_tf.data.storage.spec import (FORMAT, ID_MAP_FILES, ITEM_CATEGORY_FILE, ITEM_CLICKS_FILE, SPLITS, DatasetSpec,
                                       SpecError)
from dare_tf.data.storage.id_maps import read_id_file
from dare_tf.data.storage.shards import SEGMENT_KIND, STORE_KIND, partition_of, shard_name, shard_tag
from dare_tf.data.storage.schema import features_of
from dare_tf.data.storage.fields import field_id_file, item_field_file


MAX_PARTITIONS = 1024
# `--beam_buckets` (dare_tf.data.preparation.beam.bucket_count): at most as many as partitions.
MAX_BUCKETS = 1024


class PartitionedWriter:
    """The shards of one kind (a split's examples, or the store), one per
    partition: rows are routed to the shard of their user's partition, in the
    order they come (users ascending). Both drivers write through it."""

    def __init__(self, directory: str, kind: str, partitions: int, compression: str, indices=None,
                 tag: int | None = None):
        self.kind, self.partitions = kind, partitions
        self.names = [shard_name(kind, k, partitions, compression, tag) for k in range(partitions)]
        self.writers = {k: ShardWriter(os.path.join(directory, self.names[k]), compression)
                        for k in (range(partitions) if indices is None else indices)}
        self.clicks = dict.fromkeys(self.writers, 0)

    def write_examples(self, columns: dict[str, np.ndarray]) -> None:
        self._route(columns["uid"], encode_examples(columns))

    def write_store(self, uid: np.ndarray, lengths: np.ndarray, items: np.ndarray, categories: np.ndarray,
                    extra: dict | None = None) -> None:
        """Store records (`encode_store`: `extra` is the further fields' lists)."""
        parts = partition_of(uid, self.partitions)
        for k, n in zip(parts.tolist(), np.asarray(lengths).tolist()):
            self.clicks[k] += int(n)
        self._route(uid, encode_store(uid, lengths, items, categories, extra), parts)

    def _route(self, uid, records, parts=None):
        parts = partition_of(uid, self.partitions) if parts is None else parts
        for k in np.unique(parts).tolist():  # rows keep their order within a partition
            self.writers[k].write([records[i] for i in np.flatnonzero(parts == k).tolist()])

    def close(self) -> dict[str, dict]:
        """spec.json's `files` entries of the shards written."""
        files = {}
        for k, writer in self.writers.items():
            files[self.names[k]] = writer.close()
            if self.kind == STORE_KIND:
                files[self.names[k]]["clicks"] = self.clicks[k]
        return files


def write_lines(path: str, values: np.ndarray) -> None:
    """`values`, one per line (the dataset's tables)."""
    with open(path, "w", encoding="utf-8", newline="") as f:  # (read back by `read_id_file`)
        f.write("\n".join(map(str, np.asarray(values).tolist())))
        f.write("\n")


def write_id_maps(directory: str, raw_items, raw_categories, raw_users, item_category, rename=None) -> None:
    """The raw-id maps and the item -> category map (`item_category`: `[num_items]`
    dense categories, rows 1 .. num_items - 2 written); `rename(file name)`: the
    name each is written as (an append's pending files)."""
    def path(name):
        return os.path.join(directory, name if rename is None else rename(name))

    write_lines(path(ID_MAP_FILES["item"]), np.asarray(raw_items))
    write_lines(path(ID_MAP_FILES["category"]), np.asarray(raw_categories))
    write_lines(path(ID_MAP_FILES["user"]), np.asarray(raw_users))
    write_lines(path(ITEM_CATEGORY_FILE), np.asarray(item_category)[1:len(raw_items) + 1])


def write_item_clicks(directory: str, counts, rename=None) -> None:
    """`ITEM_CLICKS_FILE` of a `--split=time` dataset (`counts`: `[num_items]`, rows
    1 .. num_items - 2 written)."""
    counts = np.asarray(counts)
    write_lines(os.path.join(directory, ITEM_CLICKS_FILE if rename is None else rename(ITEM_CLICKS_FILE)),
                  counts[1:len(counts) - 1])


def read_item_clicks(directory: str, num_items: int) -> np.ndarray:
    """`[num_items]` clicks per dense item (`write_item_clicks`), checked against spec.json's num_items."""
    path = os.path.join(directory, ITEM_CLICKS_FILE)
    counts = np.loadtxt(path, dtype=np.int64, ndmin=1)
    if len(counts) != num_items - 2:
        raise ValueError(f"{path}: {len(counts)} lines, expected one per item ({num_items - 2}, spec.json's "
                         "num_items - 2)")
    return np.concatenate([[0], counts, [0]])


@public("dare_tf.data")
def item_categories(data_dir: str, spec: DatasetSpec, observed):
    """`[spec.num_items]` int64: the dense category of every dense item as the log
    gave it (`ITEM_CATEGORY_FILE`; padding and out-of-vocabulary rows get the
    out-of-vocabulary category). Refuses a file that does not fit the spec,
    naming its line.

    A dataset prepared before the file existed has categories only for the items
    its data hold: `observed()` then gives `(items, categories)` array pairs
    (the store's clicks, the examples' targets), and the other items get the
    out-of-vocabulary category, with a warning to prepare the dataset again."""
    path = os.path.join(data_dir, ITEM_CATEGORY_FILE)
    if not os.path.exists(path):
        category = np.full(spec.num_items, spec.oov_category, np.int64)
        for items, categories in observed():
            category[np.asarray(items, np.int64)] = categories
        category[0] = spec.oov_category
        missing = int((category[1:-1] == spec.oov_category).sum())
        if missing:
            logging.warning("%s has no %s (prepared by an earlier version): %d of %d items have no category and "
                            "get the out-of-vocabulary one; prepare the dataset again", data_dir,
                            ITEM_CATEGORY_FILE, missing, spec.num_items - 2)
        return category
    lines = read_id_file(path)
    if len(lines) != spec.num_items - 2:
        raise SpecError(f"{path}: {len(lines)} lines, expected one per item ({spec.num_items - 2}, spec.json's "
                        "num_items - 2)")
    category = np.full(spec.num_items, spec.oov_category, np.int64)
    for k, line in enumerate(lines, start=1):
        if not line.isdigit() or not 1 <= int(line) <= spec.num_categories - 2:
            raise SpecError(f"{path}:{k}: expected a dense category id in [1, {spec.num_categories - 2}], "
                            f"got {line[:40]!r}")
        category[k] = int(line)
    return category


def write_field_maps(directory: str, raw: dict, of_item: dict, num_items: int, rename=None) -> None:
    """Each field's raw-id map and item -> value map (as `write_id_maps`; the
    history-only `action` field has no item value)."""
    for name in raw:
        files = [(field_id_file(name), raw[name])]
        if name != ACTION_FIELD:
            files.append((item_field_file(name), of_item[name][1:num_items - 1]))
        for file, values in files:
            write_lines(os.path.join(directory, file if rename is None else rename(file)), values)


def read_item_field(data_dir: str, spec: DatasetSpec, name: str) -> np.ndarray:
    """`[spec.num_items]` int64: every dense item's value of field `name`
    (padding and out-of-vocabulary rows: the field's out-of-vocabulary value);
    refuses a file that does not fit spec.json, naming its line."""
    vocabulary = spec.field(name)["vocabulary"]
    path = os.path.join(data_dir, item_field_file(name))
    values = np.loadtxt(path, dtype=np.int64, ndmin=1)
    if len(values) != spec.num_items - 2:
        raise SpecError(f"{path}: {len(values)} lines, expected one per item ({spec.num_items - 2}, spec.json's "
                        "num_items - 2)")
    bad = np.flatnonzero((values < 1) | (values > vocabulary - 2))
    if len(bad):
        raise SpecError(f"{path}:{int(bad[0]) + 1}: expected a dense {name} id in [1, {vocabulary - 2}], got "
                        f"{int(values[bad[0]])}")
    return np.concatenate([[vocabulary - 1], values, [vocabulary - 1]])


def allow_open_files(count: int, partitions: int) -> None:
    """Raises this process's soft limit on open files to hold `count` shard files
    at once (the in-memory driver writes every shard of every kind together);
    refuses, naming `--partitions`, where the hard limit is lower."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = count + 64  # the log, the id maps, Python's own
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ValueError(f"partitions={partitions}: the in-memory driver writes {count} shard files at once, but "
                         f"this process may open {hard}; lower --partitions or use --runner=beam")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def layout_fields(protocol, compression: str, files: dict[str, dict], bounds=None, fields=(),
                  store_times: bool = True) -> dict:
    """spec.json's fields that describe the files (names, counts, feature spec,
    the further `fields`, `dare_tf.data.storage.fields`); with `bounds` (`--split=time`)
    each split lists the shards of the time segments (`dare_tf.data.preparation.days`) whose
    first time falls in its window; `store_times`: the store keeps every click's
    time (False: an append to a dataset prepared before it did)."""
    partitions = protocol.partitions
    if bounds is None:
        shards = {s: [shard_name(s, k, partitions, compression) for k in range(partitions)] for s in SPLITS}
    else:
        shards = {s: [] for s in SPLITS}
        for tag in sorted({shard_tag(n) for n in files if n.startswith(SEGMENT_KIND + "-")}):
            split = SPLITS[int(np.searchsorted(np.asarray(bounds), tag, side="right"))]
            shards[split] += [shard_name(SEGMENT_KIND, k, partitions, compression, tag) for k in range(partitions)]
    store = sorted((n for n in files if n.startswith(STORE_KIND + "-")), key=lambda n: n.split("-of-")[0][-5:])
    return dict(counts={s: sum(files[n]["records"] for n in names) for s, names in shards.items()},
                shards=shards, store=store, clicks_stored=sum(files[n]["clicks"] for n in store),
                files=files, compression=compression, features=features_of(list(fields), store_times),
                partitions=protocol.partitions, **({"fields": list(fields)} if fields else {}))


def log_format(log: str | LogFormat) -> LogFormat:
    """A preset's `LogFormat` by name, or `log` itself."""
    if isinstance(log, LogFormat):
        return log
    if log not in FORMATS:
        raise ValueError(f"dataset={log!r}: expected one of {sorted(FORMATS)} (or a LogFormat)")
    return FORMATS[log]


def source_fields(input_path: str, clicks: Clicks, fmt: LogFormat) -> dict:
    return dict(path=os.path.abspath(input_path), sha256=clicks.sha256, rows=clicks.rows,
                clicks=int(clicks.clicked().sum()),
                bad_lines=clicks.bad_lines, log=fmt.to_json())


def make_spec(fmt: LogFormat, protocol, source: dict, preparation: str, fields: dict) -> DatasetSpec:
    """spec.json's content; a `--split=time` dataset's `windows` (each split's first
    time) are recorded in its `protocol` beside the split's flags."""
    fields = dict(fields)
    recorded = {**protocol.to_json(), **({"windows": fields.pop("windows")} if "windows" in fields else {})}
    if "users_by_clicks" in fields:  # (the log's clicks per user: `protocol.choices_line`)
        source = {**source, "users_by_clicks": fields.pop("users_by_clicks")}
    empty = [split for split in SPLITS if "windows" in recorded and not fields["counts"][split]]
    if empty:
        val, test = (utc_time(recorded["windows"][split]) for split in ("val", "test"))
        raise ValueError(f"--split=time: the {empty[0]} window holds no example of the users with >= "
                         f"{protocol.min_clicks} clicks (train before {val}, val from {val}, test from {test}; the "
                         f"log's last row at {utc_time(source['last_time'])}); "
                         "move --val_days/--test_days (or --val_from/--test_from) or lower --min_clicks")
    return DatasetSpec(dataset=fmt.name, format=FORMAT, max_len=protocol.max_len,
                       protocol=recorded, source=source, preparation=preparation, **fields)


def check_compression(compression: str) -> str:
    if compression not in ("GZIP", ""):
        raise ValueError(f"compression={compression!r}: expected 'GZIP' or '' (none)")
    return compression
