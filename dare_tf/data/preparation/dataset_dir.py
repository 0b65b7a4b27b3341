"""A prepared dataset's directory as a whole: what belongs to it (the guard that
lets preparation replace only a dataset it wrote), its one writer and the
staging-then-rename write both preparation drivers use, and the sha256 of
its tables that spec.json records and every reader of the id maps checks."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

from absl import logging

from dare_tf._files import clean_stale, guard_output_dir, one_writer, replace_directory, staging_dir
from dare_tf.data.storage.fields import FieldSchema
from dare_tf._files import file_sha256
from dare_tf.data.storage.spec import (APPEND_JOURNAL, APPEND_LOCK, FORMAT, LEGACY_FORMATS, SPEC_FILE, TABLE_FILES,
    DatasetSpec, SpecError, append_pending)
from dare_tf.data.storage.shards import is_shard_name


def _own_files(directory: str) -> set[str] | None:
    """The entries a dataset that preparation wrote consists of, or None when
    `directory` holds no spec.json of ours."""
    try:
        with open(os.path.join(directory, SPEC_FILE)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    legacy = raw.get("format") is None and {"dataset", "shards", "protocol", "source"} <= set(raw)
    if not (raw.get("format") in (FORMAT, *LEGACY_FORMATS) or legacy):
        return None
    fields = raw.get("fields") if isinstance(raw.get("fields"), list) else []
    named = [f for f in fields if isinstance(f, dict) and isinstance(f.get("name"), str)]
    tables = (*TABLE_FILES, *FieldSchema.of(named).files())
    names = {SPEC_FILE, *tables, *raw.get("store", []), APPEND_JOURNAL, f"{APPEND_JOURNAL}.tmp", APPEND_LOCK,
             *map(append_pending, tables)}
    for shard_names in raw.get("shards", {}).values():
        names.update(shard_names)
    return names


def _own_entry(own: set[str]):
    """Whether an entry is the dataset's: listed, or named as its shards are (a
    killed append's new shards, which the next append removes)."""
    return lambda entry: entry in own or is_shard_name(entry)


def guard_dataset_dir(output_dir: str, input_path: str) -> None:
    """Raises `OutputDirError` unless `output_dir` may be replaced: it must be
    absent, an empty directory, or a dataset preparation wrote with nothing else
    in it, and must not contain the input log (`dare_tf._files.guard_output_dir`)."""
    own = _own_files(output_dir) if os.path.isdir(output_dir) else None
    claims = _own_entry(own) if own else (lambda entry: False)
    guard_output_dir(output_dir, claims, "preparation", {"the input log": input_path},
                     unclaimed=f"a dataset prepared by dare_tf (no {SPEC_FILE} of format {FORMAT!r})")


def table_digests(directory: str, fields: list, rename=lambda name: name) -> dict[str, str]:
    """spec.json's `tables`: the sha256 of each table file of a dataset with
    `fields` that it holds (`rename`: where a file lies before its commit)."""
    names = (*TABLE_FILES, *FieldSchema.of(fields).files())
    return {name: file_sha256(os.path.join(directory, rename(name))) for name in names
            if os.path.exists(os.path.join(directory, rename(name)))}


def verify_tables(data_dir: str, spec: DatasetSpec | None = None) -> None:
    """Refuses, in one line, a table file (id maps, item tables) whose sha256 is not
    the one spec.json records: raw ids mapped through an edited id map would be
    silently other items. A dataset prepared before the digests were recorded has
    none to check."""
    spec = DatasetSpec.load(data_dir) if spec is None else spec
    for name, expected in spec.tables.items():
        path = os.path.join(data_dir, name)
        found = file_sha256(path) if os.path.exists(path) else "absent"
        if found != expected:
            raise SpecError(f"{path}: its sha256 is {found[:16]}, not the {expected[:16]} that spec.json records: "
                            "the file was changed after preparation, and raw ids mapped through it would be other "
                            "ids; restore it, or prepare the dataset again")


def write_prepared(output_dir: str, input_path: str, build) -> DatasetSpec:
    """Runs `build(staging_directory) -> DatasetSpec` in a staging directory beside
    `output_dir` and renames it into place (see `prepare`); both drivers use it.
    One writer per dataset: another preparation or append writing `output_dir`
    is refused (`dare_tf._files.one_writer`)."""
    with one_writer(output_dir, "data.prepare"):
        return _write_prepared(output_dir, input_path, build)


def _write_prepared(output_dir: str, input_path: str, build) -> DatasetSpec:
    guard_dataset_dir(output_dir, input_path)
    # A symbolic link stays a link: the directory it points to is what is replaced.
    output_dir = os.path.realpath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    for path in clean_stale(parent, os.path.basename(output_dir)):
        logging.info("removed %s, left by a killed run", path)
    staging = staging_dir(parent, os.path.basename(output_dir))
    try:
        spec = build(staging)
        spec = dataclasses.replace(spec, tables=table_digests(staging, spec.fields))
        with open(os.path.join(staging, SPEC_FILE), "w") as f:
            f.write(spec.to_json())
        guard_dataset_dir(output_dir, input_path)  # nothing of the user's appeared meanwhile
        replace_directory(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return spec
