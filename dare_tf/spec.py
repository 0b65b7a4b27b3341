"""The prepared dataset's own description: `DIR/spec.json` and its id-map files.

`data.prepare` writes it; the input pipeline, the trainers and the serving
export read vocabulary sizes, sequence length and shard lists only from here.
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
SCALAR_FEATURES = ("uid", "target_item", "target_category", "label")
SEQUENCE_FEATURES = ("hist_items", "hist_categories")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What `spec.json` holds.

    Attributes:
        dataset: `taobao`, `tmall` (or the name of a synthetic log's format).
        num_items, num_categories: vocabulary sizes: padding row 0, dense
            ids 1..num_x - 2 in order of first appearance, and the
            out-of-vocabulary row num_x - 1 (serving maps unknown ids there).
        num_users: users in the log plus padding row 0.
        max_len: history length L of every example.
        users: users that qualified (>= min_clicks clicks).
        counts: examples per split.
        shards: file names (relative to the directory) per split.
        protocol: the sample-construction parameters used.
        source: input path, sha256, rows read, clicks kept, bad lines skipped.
    """

    dataset: str
    num_items: int
    num_categories: int
    num_users: int
    max_len: int
    users: int
    counts: dict[str, int]
    shards: dict[str, list[str]]
    protocol: dict[str, Any]
    source: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @property
    def oov_item(self) -> int:
        return self.num_items - 1

    @property
    def oov_category(self) -> int:
        return self.num_categories - 1

    def shard_paths(self, data_dir: str, split: str) -> list[str]:
        if split not in self.shards:
            raise KeyError(f"{os.path.join(data_dir, SPEC_FILE)}: no split {split!r}; "
                           f"splits: {sorted(self.shards)}")
        return [os.path.join(data_dir, name) for name in self.shards[split]]

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
        missing = [name for name in fields if name not in raw]
        if missing:
            raise ValueError(f"{path}: missing field(s) {missing}")
        for name in ("num_items", "num_categories", "num_users", "max_len"):
            if not isinstance(raw[name], int) or raw[name] < 1:
                raise ValueError(f"{path}: field {name!r} must be a positive integer, got {raw[name]!r}")
        return cls(**{name: raw[name] for name in fields})


def read_id_map(data_dir: str, kind: str) -> list[str]:
    """Raw ids in dense-id order: element k - 1 is the raw id of dense id k."""
    path = os.path.join(data_dir, ID_MAP_FILES[kind])
    with open(path) as f:
        return f.read().splitlines()
