"""The journaled commit of an append (`dare_tf.data.preparation.append`): new shards
under new names, the new id maps beside the old ones (`.NAME.append`), the new
spec.json as the journal (`APPEND_JOURNAL`, the commit point), then the id maps
and spec.json renamed into place, spec.json last, and the shards it no longer
lists removed. `recover` finishes a commit that was killed, or removes what a
killed append wrote before it."""

from __future__ import annotations

import dataclasses
import json
import os

from absl import logging

from dare_tf.data.storage.fields import FieldSchema
from dare_tf.data.preparation.dataset_dir import table_digests
from dare_tf.data.preparation.prepared import (write_field_maps, write_id_maps, write_item_clicks)
from dare_tf.data.storage.spec import APPEND_JOURNAL, SPEC_FILE, TABLE_FILES, DatasetSpec, append_pending
from dare_tf.data.storage.shards import is_shard_name


def _listed(spec_path: str) -> set[str]:
    with open(spec_path) as f:
        raw = json.load(f)
    return set(raw["files"])


def _remove_unlisted_shards(data_dir: str, listed: set[str]) -> None:
    for entry in sorted(os.listdir(data_dir)):
        if is_shard_name(entry) and entry not in listed:
            os.remove(os.path.join(data_dir, entry))
            logging.info("removed %s: a shard spec.json does not list (an interrupted append's)", entry)


def _tables(spec_path: str) -> tuple[str, ...]:
    """The table files of the dataset whose spec.json (or journal) is `spec_path`."""
    with open(spec_path) as f:
        return (*TABLE_FILES, *FieldSchema.of(json.load(f).get("fields", [])).files())


def commit(data_dir: str) -> None:
    """Renames the journaled files into place (spec.json last) and removes the shards it no longer lists."""
    for name in _tables(os.path.join(data_dir, APPEND_JOURNAL)):
        if os.path.exists(os.path.join(data_dir, append_pending(name))):
            os.replace(os.path.join(data_dir, append_pending(name)), os.path.join(data_dir, name))
    os.replace(os.path.join(data_dir, APPEND_JOURNAL), os.path.join(data_dir, SPEC_FILE))
    _remove_unlisted_shards(data_dir, _listed(os.path.join(data_dir, SPEC_FILE)))


def recover(data_dir: str) -> None:
    """Finishes an append that was killed during its commit, or removes what a
    killed append wrote before it."""
    if os.path.exists(os.path.join(data_dir, APPEND_JOURNAL)):
        logging.warning("%s: finishing the append that was stopped while it committed", data_dir)
        commit(data_dir)
        return
    for path in [os.path.join(data_dir, append_pending(name)) for name in _tables(
            os.path.join(data_dir, SPEC_FILE))] + [
            os.path.join(data_dir, f"{APPEND_JOURNAL}.tmp")]:
        if os.path.exists(path):
            os.remove(path)
    _remove_unlisted_shards(data_dir, _listed(os.path.join(data_dir, SPEC_FILE)))


def write_journal(data_dir: str, new_spec: DatasetSpec, new) -> DatasetSpec:
    """Writes the new id maps and tables of `new` (the append's `_NewRows`) beside the
    old ones, then the new spec.json (with the tables' digests, as returned) as
    the journal: the commit point."""
    write_id_maps(data_dir, new.raw_items, new.raw_categories, new.raw_users, new.catalogue.categories,
                  rename=append_pending)
    write_field_maps(data_dir, new.raw_fields, new.catalogue.fields, new.num_items, rename=append_pending)
    write_item_clicks(data_dir, new.catalogue.counts, rename=append_pending)
    new_spec = dataclasses.replace(new_spec, tables=table_digests(data_dir, new_spec.fields, rename=append_pending))
    journal = os.path.join(data_dir, APPEND_JOURNAL)
    with open(f"{journal}.tmp", "w") as f:
        f.write(new_spec.to_json())
    os.replace(f"{journal}.tmp", journal)  # the commit point: from here on the append is finished, not undone
    return new_spec
