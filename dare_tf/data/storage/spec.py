"""The prepared dataset's own description: `DIR/spec.json`, its id-map files and
its shards' names (the features' names are `dare_tf.data.storage.schema`'s). The input
pipeline, the trainers and the export read vocabulary sizes, sequence length
and shard lists only from `spec.json`. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from dare_tf._faces import public, public_names
from dare_tf.data.storage.schema import STORE_TIMES, record_columns
from dare_tf.data.storage.shards import COMPRESSIONS, SEGMENT_KIND, SHARD_NAME, STORE_KIND, shard_name

SPEC_FILE = "spec.json"
SPLITS = ("train", "val", "test")
# Raw id of dense id k (k >= 1) is line k of each file (1-based), as text.
ID_MAP_FILES = {"item": "item_ids.txt", "category": "category_ids.txt", "user": "user_ids.txt"}
# Dense category id of dense item k is line k: the category of the item's last row
# in the log, for every item of the vocabulary (clicked by a qualifying user or not).
ITEM_CATEGORY_FILE = "item_categories.txt"
# `--split=time`: the clicks of dense item k up to the dataset's last day are line k
# (the negatives of an appended day are drawn by them: `dare_tf.data.preparation.days`).
ITEM_CLICKS_FILE = "item_clicks.txt"
# The dataset's tables beside spec.json and the shards (an append replaces them all).
TABLE_FILES = (*ID_MAP_FILES.values(), ITEM_CATEGORY_FILE, ITEM_CLICKS_FILE)
# A finished append's new spec.json, renamed to spec.json as its commit ends (`dare_tf.data.preparation.append`).
APPEND_JOURNAL = ".spec.json.append"
# The lock of appends before the one writer lock beside the dataset (`dare_tf._files.one_writer`):
# a dataset may still hold it.
APPEND_LOCK = ".append.lock"


def append_pending(name: str) -> str:
    """Where an append writes the dataset file `name` before its commit renames it into place."""
    return f".{name}.append"

# The marker that a directory is a dataset written by dare_tf's preparation;
# earlier formats (per-example TFRecords, then `.npz` shards) are recognised as
# ours (preparation may replace them) but must be prepared again to be read.
FORMAT = "dare_tf.prepared/3"
LEGACY_FORMATS = ("dare_tf.prepared/1", "dare_tf.prepared/2")

# Bounds of spec.json's sizes: ids are int32 when read (embedding rows), and
# histories longer than this are not assembled.
MAX_ID = 2**31 - 1
MAX_LEN = 1 << 20
class SpecError(ValueError):
    """spec.json is missing, not valid JSON, of another format, or has a field of the wrong type or range."""


@public("dare_tf.data")
@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What `spec.json` holds.

    Attributes:
        dataset: the log's format: a preset (`taobao`, `tmall`) or the file
            format of a custom log (`csv`, `tsv`, `parquet`).
        format: `FORMAT`, the mark of a directory that preparation wrote.
        num_items, num_categories: vocabulary sizes: padding row 0, dense
            ids 1..num_x - 2 in order of first appearance, and the
            out-of-vocabulary row num_x - 1 (serving maps unknown ids there).
        num_users: users in the log plus padding row 0.
        max_len: the default history length L (a trainer may choose another).
        users: users that qualified (>= min_clicks clicks; `--split=time`: by
            its last day).
        counts: examples per split.
        shards: example shard names (relative to the directory) per split;
            shard k of each split holds the examples of partition k's users
            (`--split=time`: one shard per partition and time segment, the
            segments in time order, so name j is partition j % partitions's).
        protocol: the sample-construction parameters used.
        source: input path, sha256, rows read, clicks kept, bad lines
            skipped, and how the log was read (`log`: file format, columns).
        preparation: the id of this preparation (same log, format and
            protocol: same id).
        store: the sequence store's shard names: shard k holds partition k's
            users (`--split=time`: every user of the log, named by the day the
            shard was written on: `store-<time>-0000k-of-0000P`).
        clicks_stored: clicks in the store (the qualifying users' clicks;
            `--split=time`: every user's).
        files: per shard: `bytes`, `records`, `sha256` (and `clicks` for
            store shards); a file that differs was truncated, modified or
            comes from another preparation.
        compression: `GZIP` or `""` (none), as `tf.data.TFRecordDataset` takes it.
        features: the feature spec of the example and store records.
        partitions: shards per kind (users are assigned by `dare_tf.data.storage.shards.partition_of`).
        fields: further fields of every behaviour, in order (`dare_tf.data.storage.fields`):
            `name`, `vocabulary` (padding row 0 and an out-of-vocabulary row
            included), `history_only` and the `column` it was read from, or
            the derived time gap's `edges`; absent from spec.json when none.
        tables: the sha256 of each table file (id maps, item tables), as
            preparation wrote them: checked before raw ids are mapped through
            them (`dare_tf.data.preparation.dataset_dir.verify_tables`); absent in datasets
            prepared before it was recorded.
    """

    dataset: str
    format: str
    num_items: int
    num_categories: int
    num_users: int
    max_len: int
    users: int
    counts: dict[str, int]
    shards: dict[str, list[str]]
    protocol: dict[str, Any]
    source: dict[str, Any]
    preparation: str
    store: list[str]
    clicks_stored: int
    files: dict[str, dict[str, Any]]
    compression: str
    features: dict[str, Any]
    partitions: int
    fields: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tables: dict[str, str] = dataclasses.field(default_factory=dict)

    def _dict(self) -> dict:
        """The fields as spec.json holds them: `fields` and `tables` only when there
        are any (so a dataset without is recorded, and identified, as before they
        existed)."""
        d = dataclasses.asdict(self)
        for optional in ("fields", "tables"):
            if not d[optional]:
                del d[optional]
        return d

    def to_json(self) -> str:
        return json.dumps(self._dict(), indent=2, sort_keys=True)

    @property
    def field_schema(self):
        """Its `fields` as a `dare_tf.data.storage.fields.FieldSchema`."""
        from dare_tf.data.storage.fields import FieldSchema

        return FieldSchema.of(self.fields)

    def field(self, name: str) -> dict:
        """The `fields` entry named `name`; `KeyError` naming the dataset's fields."""
        for field in self.fields:
            if field["name"] == name:
                return field
        raise KeyError(f"the dataset has no field {name!r}; its fields: {[f['name'] for f in self.fields]}")

    @property
    def record_columns(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Its example features and store lists (`record_columns`; a dataset
        prepared before the store kept every click's time has them where its
        `features` say)."""
        return record_columns(self.fields, self.store_times)

    @property
    def store_times(self) -> bool:
        """Whether the store keeps every click's time (`STORE_TIMES`)."""
        return STORE_TIMES in self.features.get("store", {})

    def fingerprint(self) -> str:
        """A digest of everything that defines the examples (source log, protocol,
        vocabularies, counts): two directories with the same fingerprint hold the same
        dataset wherever they lie."""
        import hashlib

        fields = self._dict()
        fields["source"] = {k: v for k, v in fields["source"].items() if k != "path"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def string_ids(self) -> bool:  # `--string_ids`: the id maps hold strings, and the exports take them
        return bool(self.source.get("log", {}).get("string_ids", False))

    @property
    def oov_item(self) -> int:
        return self.num_items - 1

    @property
    def oov_category(self) -> int:
        return self.num_categories - 1

    def records(self, name: str) -> int:
        return int(self.files[name]["records"])

    def shard_files(self, kind: str, partitions=None) -> list[str]:
        """Shard names of `kind` (a split or `store`), of `partitions` (indices; all by default)."""
        names = self.store if kind == STORE_KIND else self.shards[kind]
        if partitions is None:
            return list(names)
        wanted = {int(k) for k in partitions}
        return [n for j, n in enumerate(names) if j % self.partitions in wanted]

    @classmethod
    def load(cls, data_dir: str) -> "DatasetSpec":
        path = os.path.join(data_dir, SPEC_FILE)
        if os.path.exists(os.path.join(data_dir, APPEND_JOURNAL)):
            raise SpecError(f"{data_dir}: an append (data.prepare --append) is committing, or was stopped while it "
                            f"committed; if none runs, run python -m data.prepare --append --output_dir={data_dir} "
                            "--input=LOG again to finish it")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: is {data_dir!r} a prepared dataset "
                                    "(python -m data.prepare ...)?")
        try:
            with open(path) as f:
                raw = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SpecError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(raw, dict):
            raise SpecError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        if raw.get("format") != FORMAT:
            raise SpecError(f"{path}: format {raw.get('format')!r} is not {FORMAT!r} (TFRecord store and "
                            "examples); prepare the dataset again with this version (python -m data.prepare ...)")
        fields = [f.name for f in dataclasses.fields(cls)]
        raw.setdefault("fields", [])
        raw.setdefault("tables", {})
        missing = [name for name in fields if name not in raw]
        if missing:
            raise SpecError(f"{path}: missing field(s) {missing}")
        _validate(path, raw)
        return cls(**{name: raw[name] for name in fields})


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(path: str, raw: dict) -> None:
    """Types and ranges of spec.json's fields; shard names are plain file names
    of this directory (never a path that leads out of it)."""
    def bad(field, expected, value):
        raise SpecError(f"{path}: field {field!r} must be {expected}, got {json.dumps(value)[:80]}")

    for name, upper in (("num_items", MAX_ID), ("num_categories", MAX_ID), ("num_users", MAX_ID),
                        ("max_len", MAX_LEN), ("partitions", 1 << 16)):
        if not _is_int(raw[name]) or not 1 <= raw[name] <= upper:
            bad(name, f"an integer in [1, {upper}]", raw[name])
    for name in ("users", "clicks_stored"):
        if not _is_int(raw[name]) or raw[name] < 0:
            bad(name, "a non-negative integer", raw[name])
    if raw["compression"] not in COMPRESSIONS.values():
        bad("compression", f"one of {sorted(COMPRESSIONS.values())}", raw["compression"])
    for name in ("dataset", "preparation"):
        if not isinstance(raw[name], str):
            bad(name, "a string", raw[name])
    for name in ("protocol", "source", "features", "files", "counts", "shards", "tables"):
        if not isinstance(raw[name], dict):
            bad(name, "an object", raw[name])
    if not all(isinstance(k, str) and os.path.basename(k) == k and isinstance(v, str)
               for k, v in raw["tables"].items()):
        bad("tables", "an object of file names and their sha256", raw["tables"])
    partitions = raw["partitions"]
    lists = {f"shards.{s}": raw["shards"].get(s) for s in SPLITS}
    lists["store"] = raw["store"]
    for field, names in lists.items():
        kind = field.split(".")[-1]  # the split's name, or "store": a shard names what it holds
        segments = kind != "store"  # a split may list several segments' shards (`--split=time`)
        if not isinstance(names, list) or (len(names) % partitions if segments else len(names) != partitions):
            bad(field, f"a list of {partitions} shard names (one per partition)" + (
                " per time segment" if segments else ""), names)
        for k, name in enumerate(names):
            m = SHARD_NAME.fullmatch(name) if isinstance(name, str) else None
            if (m is None or m["kind"] not in (kind, SEGMENT_KIND if segments else kind)
                    or int(m["index"]) != k % partitions or int(m["count"]) != partitions):
                bad(f"{field}[{k}]", f"a shard file name like {shard_name(kind, k % partitions, partitions, 'GZIP')!r} "
                    "(inside the dataset directory)", name)
            entry = raw["files"].get(name)
            if (not isinstance(entry, dict) or not all(_is_int(entry.get(k)) and entry[k] >= 0
                                                       for k in ("bytes", "records"))
                    or not isinstance(entry.get("sha256"), str)):
                bad(f"files[{name!r}]", "an object with integer 'bytes' and 'records' and a 'sha256'", entry)
    if not isinstance(raw["fields"], list) or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str) and _is_int(f.get("vocabulary"))
            and f["vocabulary"] >= 2 and isinstance(f.get("history_only"), bool) for f in raw["fields"]):
        bad("fields", "a list of objects with a 'name', a 'vocabulary' >= 2 and 'history_only'", raw["fields"])
    for split in SPLITS:
        count = raw["counts"].get(split)
        if not _is_int(count) or count != sum(raw["files"][n]["records"] for n in raw["shards"][split]):
            bad(f"counts.{split}", f"the number of records in the {split} shards", count)


public_names("dare_tf.data", "FORMAT", "SPLITS")
