"""The schema of every example, and the prepared dataset's own description
(`DIR/spec.json` and its id-map files).

The feature names, dtypes and shapes below are the only definition of the
schema: the example writer (`dare_tf.data.protocol`), the reader
(`dare_tf.data.pipeline`), the model's inputs (`DareModel`), the serving
signatures (`dare_tf.serving.export`) and the client all use them.
Preparation writes `spec.json`; the input pipeline, the trainers and the
serving export read vocabulary sizes, sequence length and shard lists only
from there. Pure Python: importing it needs no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

SPEC_FILE = "spec.json"
SPLITS = ("train", "val", "test")
# Raw id of dense id k (k >= 1) is line k of each file (1-based), as text.
ID_MAP_FILES = {"item": "item_ids.txt", "category": "category_ids.txt", "user": "user_ids.txt"}
# One example as the pipeline yields it: int32 scalars and int32 [L] histories
# (dense ids, 0 = padding, oldest first), assembled from the stored example
# (user, cut-off position, target, label) and its user's sequence in the store.
USER = "uid"
TARGET_ITEM = "target_item"
TARGET_CATEGORY = "target_category"
HIST_ITEMS = "hist_items"
HIST_CATEGORIES = "hist_categories"
LABEL = "label"
SCALAR_FEATURES = (USER, TARGET_ITEM, TARGET_CATEGORY, LABEL)
SEQUENCE_FEATURES = (HIST_ITEMS, HIST_CATEGORIES)
# What a model (and a serving request) takes, in this order.
MODEL_INPUTS = (TARGET_ITEM, TARGET_CATEGORY, HIST_ITEMS, HIST_CATEGORIES)
# The marker that a directory is a dataset written by dare_tf's preparation;
# earlier formats (per-example histories in TFRecords) are recognised as ours
# (preparation may replace them) but must be prepared again to be read.
FORMAT = "dare_tf.prepared/2"
LEGACY_FORMATS = ("dare_tf.prepared/1",)


# Columns of an example shard, and of a store shard (per user, then per click).
EXAMPLE_COLUMNS = ("uid", "position", "target_item", "target_category", "label")
STORE_USER_COLUMNS = ("uid", "length")
STORE_CLICK_COLUMNS = ("items", "categories")


def example_shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.npz"


def store_shard_name(index: int) -> str:
    return f"store-{index:05d}.npz"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What `spec.json` holds.

    Attributes:
        dataset: `taobao`, `tmall` (or the name of a synthetic log's format).
        format: `FORMAT`, the mark of a directory that preparation wrote.
        num_items, num_categories: vocabulary sizes: padding row 0, dense
            ids 1..num_x - 2 in order of first appearance, and the
            out-of-vocabulary row num_x - 1 (serving maps unknown ids there).
        num_users: users in the log plus padding row 0.
        max_len: the default history length L (a trainer may choose another).
        users: users that qualified (>= min_clicks clicks).
        counts: examples per split.
        shards: example shard names (relative to the directory) per split.
        protocol: the sample-construction parameters used.
        source: input path, sha256, rows read, clicks kept, bad lines skipped.
        preparation: the id that the store and every example shard record.
        store: the sequence store's shard names, in user order.
        clicks_stored: clicks in the store (the qualifying users' clicks).
        files: size in bytes of every shard (a shorter file is truncated).
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
    files: dict[str, int]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def fingerprint(self) -> str:
        """A digest of everything that defines the examples (source log, protocol,
        vocabularies, counts): two directories with the same fingerprint hold the same
        dataset wherever they lie."""
        import hashlib

        fields = dataclasses.asdict(self)
        fields["source"] = {k: v for k, v in fields["source"].items() if k != "path"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def oov_item(self) -> int:
        return self.num_items - 1

    @property
    def oov_category(self) -> int:
        return self.num_categories - 1

    @classmethod
    def load(cls, data_dir: str) -> "DatasetSpec":
        path = os.path.join(data_dir, SPEC_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: is {data_dir!r} a prepared dataset "
                                    "(python -m data.prepare ...)?")
        try:
            with open(path) as f:
                raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if raw.get("format") != FORMAT:
            raise ValueError(f"{path}: format {raw.get('format')!r} is not {FORMAT!r} (the per-user sequence "
                             "store); prepare the dataset again with this version (python -m data.prepare ...)")
        missing = [name for name in fields if name not in raw]
        if missing:
            raise ValueError(f"{path}: missing field(s) {missing}")
        for name in ("num_items", "num_categories", "num_users", "max_len"):
            if not isinstance(raw[name], int) or raw[name] < 1:
                raise ValueError(f"{path}: field {name!r} must be a positive integer, got {raw[name]!r}")
        return cls(**{name: raw[name] for name in fields})


def id_map_digest(data_dir: str) -> str:
    """A digest of the item and category id maps: two exports (a retrieval model
    and a ranker) agree on raw ids exactly when their digests are equal."""
    import hashlib

    digest = hashlib.sha256()
    for kind in ("item", "category"):
        with open(os.path.join(data_dir, ID_MAP_FILES[kind]), "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def read_id_map(data_dir: str, kind: str) -> list[str]:
    """Raw ids in dense-id order: element k - 1 is the raw id of dense id k."""
    path = os.path.join(data_dir, ID_MAP_FILES[kind])
    with open(path) as f:
        return f.read().splitlines()
