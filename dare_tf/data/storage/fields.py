"""A prepared dataset's further fields of every behaviour, beside its item and
category: what preparation makes of a log's field columns (`--columns=...,
field:brand=COL`, a preset's `--fields=seller,brand`) and of `--time_gap`.

Its files are `<name>_ids.txt` and `item_<name>.txt` (`FieldSchema.files`;
`dare_tf.data.preparation.prepared` writes and reads them).

- A column field gets dense 1-based ids in order of first appearance (as
  items and categories do), an id map (`<name>_ids.txt`), a vocabulary in
  spec.json (padding row 0 and an out-of-vocabulary row included), each
  item's value (`item_<name>.txt`: the value of the item's last row, which a
  negative target takes, as its category does), one int64 list per stored
  user beside `items` and `categories`, and the example feature
  `target_<name>`.
- The time gap (`--time_gap`) is derived when a history is read: the bucket
  of `target time - behaviour time` (time-column units, seconds for Unix
  times) among spec.json's `edges` (0, 1, 2, 4, ..., 2^TIME_GAP_LOG2): bucket
  b (1-based) holds the gaps in `[edges[b-1], edges[b])`, the last one every
  longer gap, and a gap below 0 (a per-user log kept in file order) falls in
  bucket 1. The store keeps every click's time (`times`), the examples
  their target's (`time`); the field is history-only (the target has no gap).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dare_tf.data.logs.clicks import dense_ids
from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.storage.schema import (INPUT_ROLES, TIME_GAP, candidate_feature, history_feature, input_role,
    target_feature)

# The fields with no item value, in the history only: the time gap and the action (`--action_field`).
HISTORY_ONLY = (TIME_GAP, ACTION_FIELD)
# Each role's input name of a field (`dare_tf.data.storage.schema` spells them).
_INPUT_NAME = {"hist": history_feature, "target": target_feature, "candidate": candidate_feature}

# The time gap's last bucket edge is 2^TIME_GAP_LOG2 time units (2^40 s: 34,000 years).
TIME_GAP_LOG2 = 40


def time_gap_edges() -> list[int]:
    """The time gap's bucket edges, as spec.json records them."""
    return [0] + [1 << i for i in range(TIME_GAP_LOG2 + 1)]


def time_gap_entry() -> dict:
    """spec.json's `fields` entry of the time gap."""
    edges = time_gap_edges()
    return {"name": TIME_GAP, "vocabulary": len(edges) + 1, "history_only": True, "edges": edges}


def time_gap_buckets(gaps, edges, xp=np):
    """The buckets (1..len(edges)) of `gaps` (any shape) among `edges`: in numpy, or
    with `xp=jax.numpy` inside a jitted function (the trainer on JAX's windows);
    `time_gap_buckets_tensor` is the same in TensorFlow, whose `searchsorted` takes
    only flat values."""
    if xp is np:
        edges, gaps = np.asarray(edges, np.int64), np.asarray(gaps, np.int64)
    return xp.maximum(xp.searchsorted(edges, gaps, side="right"), 1)


def time_gap_buckets_tensor(gaps, edges):
    """`time_gap_buckets` in TensorFlow: the int64 bucket of each of `gaps` (any
    shape) among `edges` (the training pipeline's and the exports')."""
    import tensorflow as tf

    bucket = tf.searchsorted(edges, tf.reshape(gaps, [-1]), side="right", out_type=tf.int64)
    return tf.reshape(tf.maximum(bucket, 1), tf.shape(gaps))


def field_id_file(name: str) -> str:
    """A field's raw-id map (line k: the raw id of dense id k), as `ID_MAP_FILES`."""
    return f"{name}_ids.txt"


def item_field_file(name: str) -> str:
    """Line k: the dense value of a field of dense item k (its last row), as `ITEM_CATEGORY_FILE`."""
    return f"item_{name}.txt"


def column_entries(fmt, vocabularies: dict) -> list[dict]:
    """spec.json's `fields` entries of a log's column fields (`vocabularies`: each
    one's, in `--columns` order, then `--action_field`'s history-only `action`)."""
    columns = {**fmt.field_columns, **({ACTION_FIELD: fmt.role_columns["action"]} if fmt.action_field else {})}
    return [{"name": name, "vocabulary": vocabularies[name], "history_only": name in HISTORY_ONLY,
             "column": columns[name]} for name in columns]


def last_rows(item: np.ndarray) -> np.ndarray:
    """The row of each item's last occurrence in `item` (a log's item column), one per distinct item."""
    return len(item) - 1 - np.unique(item[::-1], return_index=True)[1]


class DenseFields:
    """The dense ids of a log's column fields (`Clicks.fields`, rows as `item`).

    Attributes:
        values: name -> int32 dense ids of the rows.
        raw: name -> the raw id of each dense id (dense id k is `raw[k - 1]`).
        of_item: name -> `[num_items]` each dense item's value: its last row's
            (0 for padding and out-of-vocabulary).
    """

    def __init__(self, raw_fields: dict, item: np.ndarray, num_items: int):
        self.values, self.raw, self.of_item = {}, {}, {}
        last = last_rows(item) if len(raw_fields) else None
        for name, raw in raw_fields.items():
            dense, self.raw[name] = dense_ids(raw)
            self.values[name] = dense.astype(np.int32)
            self.of_item[name] = np.zeros(num_items, np.int32)
            self.of_item[name][item[last]] = self.values[name][last]

    def entries(self, fmt) -> list[dict]:
        """spec.json's `fields` entries (`column_entries`)."""
        return column_entries(fmt, {name: len(raw) + 2 for name, raw in self.raw.items()})


def spec_fields(entries: list[dict], time_gap: bool) -> list[dict]:
    """spec.json's `fields`: the column fields, then the time gap."""
    return [*entries, *([time_gap_entry()] if time_gap else [])]


@dataclasses.dataclass(frozen=True)
class FieldSchema:
    """The behaviour fields beside item and category of a dataset (spec.json's
    `fields`) or a model (`ModelConfig.fields`, whose `BehaviorField`s are views
    of these entries with their widths), in order: which are column fields (read
    from a log, stored per click, mapped through id maps) and which is derived
    (the time gap, computed from the clicks' times and bucketed by `edges`), the
    input name of each field in each role (`hist_`, `target_`, `candidate_`),
    the dataset's table files, and the time gap's one bucketing per backend.

    `FieldSchema.of(spec.fields)` (or `DatasetSpec.field_schema`),
    `FieldSchema.of(model_config.fields)`; `to_spec()` gives the entries back."""

    entries: tuple[dict, ...] = ()

    @classmethod
    def of(cls, fields) -> "FieldSchema":
        """From spec.json's entries (dicts), `BehaviorField`s or a `FieldSchema`."""
        if isinstance(fields, cls):
            return fields
        return cls(tuple(dict(f) if isinstance(f, dict) else
                         {"name": f.name, "vocabulary": f.vocabulary, "history_only": f.history_only}
                         for f in fields))

    def to_spec(self) -> list[dict]:
        """spec.json's `fields`."""
        return [dict(f) for f in self.entries]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.entries)

    @property
    def columns(self) -> tuple[str, ...]:
        """The column fields (all but the time gap): what a store keeps per click."""
        return tuple(name for name in self.names if self.is_column(name))

    @property
    def time_gap(self) -> bool:
        return TIME_GAP in self.names

    @property
    def edges(self) -> list[int] | None:
        """The time gap's bucket edges, as spec.json records them (None without one)."""
        return next((f.get("edges") for f in self.entries if f["name"] == TIME_GAP), None)

    def is_column(self, name: str) -> bool:
        return name != TIME_GAP

    def inputs(self, role: str) -> list[str]:
        """The inputs of the fields in `role`: `hist`, every field's `hist_<name>`;
        `target` or `candidate`, `<role>_<name>` of those with a target value."""
        if role not in INPUT_ROLES:
            raise ValueError(f"role {role!r}: one of {INPUT_ROLES}")
        return [_INPUT_NAME[role](f["name"]) for f in self.entries if role == "hist" or not f.get("history_only")]

    def keys(self, target: str = "target") -> list[str]:
        """A model's field inputs: `inputs("hist")`, then `inputs(target)`."""
        return self.inputs("hist") + self.inputs(target)

    @staticmethod
    def field_of(key: str) -> str:
        """`hist_brand`, `target_brand`, `candidate_brand` -> `brand`."""
        input_role(key)
        return key.split("_", 1)[1]

    def files(self) -> tuple[str, ...]:
        """The dataset's table files of its fields: an id map of each column field, and
        each item's value of those with a target."""
        out = []
        for field in self.entries:
            if self.is_column(field["name"]):
                out += [field_id_file(field["name"])] + [item_field_file(field["name"])] * (not field["history_only"])
        return tuple(out)

    def buckets_tensor(self, gaps, edges=None):
        """The time gap's buckets of `gaps` in TensorFlow (`time_gap_buckets_tensor`;
        `edges`: a tensor of `self.edges`, made once)."""
        return time_gap_buckets_tensor(gaps, self.edges if edges is None else edges)
