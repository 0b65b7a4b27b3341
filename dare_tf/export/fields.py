"""A served model's further behaviour fields (`ModelConfig.fields`, spec.json's
`fields`): one signature input per field and role, raw values mapped in-graph
as items and categories are.

- A column field (a brand, a seller) takes raw ids: `target_<name>` `[B]`
  (`candidate_<name>` `[U, N]` in `rank`) and `hist_<name>` beside
  `hist_items`; they are mapped through the dataset's `<name>_ids.txt`
  (unknown ids: the out-of-vocabulary row).
- The time gap takes `hist_time_gap`: each behaviour's gap to the request's
  time, in the log's time unit (seconds for Unix times), bucketed in-graph
  by the edges spec.json records (`dare_tf.data.storage.fields`).

A history field's slots follow `hist_items`: where it is padding, so is the field.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from dare_tf.data.storage.fields import FieldSchema, field_id_file, item_field_file
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.id_maps import read_id_file
from dare_tf.export.tf_serving import id_table

# `item_fields`' answer for an item the export does not know (no raw id is this low; "" with string ids).
UNKNOWN = np.iinfo(np.int64).min


class ServedFields:
    """The raw-to-dense maps of a model's fields, checked against the dataset's
    spec.json in one line (`ValueError`)."""

    def __init__(self, fields, spec: DatasetSpec, data_dir: str):
        self.fields = tuple(fields)
        self.schema = FieldSchema.of(self.fields)
        self.tables, self.edges, self.examples, self.raw_of_item = {}, None, {}, {}
        available = {f["name"]: f for f in spec.fields}
        for field in self.fields:
            entry = available.get(field.name)
            if entry is None or entry["vocabulary"] != field.vocabulary:
                raise ValueError(f"the model's field {field.name!r} (vocabulary {field.vocabulary}) is not one of "
                                 f"{data_dir}/spec.json's fields "
                                 f"{[(f['name'], f['vocabulary']) for f in spec.fields]}")
            if not self.schema.is_column(field.name):  # (the time gap: bucketed, no id map)
                self.edges = tf.constant(entry["edges"], tf.int64)
                self.examples[field.name] = 0
            else:
                path = os.path.join(data_dir, field_id_file(field.name))
                # (`--string_ids`: every field's raw values are text, the action's its code as text: "2")
                strings = spec.string_ids
                self.tables[field.name] = id_table(path, field.vocabulary - 1, strings)
                raw = np.array(read_id_file(path), object if strings else np.int64)
                self.examples[field.name] = raw[0] if strings else int(raw[0])
                if field.history_only:  # (an action: no item value)
                    continue
                # Each dense item's raw value (0: padding, last: out of vocabulary -> UNKNOWN, "" for strings).
                of_item = np.loadtxt(os.path.join(data_dir, item_field_file(field.name)), dtype=np.int64, ndmin=1)
                unknown = "" if strings else UNKNOWN
                self.raw_of_item[field.name] = tf.constant(np.concatenate([[unknown], raw[of_item - 1], [unknown]]))

    def dense(self, name: str, raw):
        """Raw values of field `name` (an input without its prefix) -> dense int64 ids."""
        if not self.schema.is_column(name):
            return self.schema.buckets_tensor(raw, self.edges)
        return self.tables[name].lookup(raw)

    def trackables(self) -> list:
        return [t.table for t in self.tables.values()]

    @property
    def names(self) -> str:
        """The model's fields, comma-separated, as the `dataset` signature reports them."""
        return ",".join(f.name for f in self.fields)

    def item_values(self, dense_items) -> dict:
        """`item_fields`: each column field's raw value of the dense items (the value
        of the item's last row in the dataset; `UNKNOWN` for an unknown item)."""
        return {name: tf.gather(values, dense_items) for name, values in self.raw_of_item.items()}
