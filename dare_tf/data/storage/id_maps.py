"""A prepared dataset's id-map files (`ID_MAP_FILES`, the fields' `<name>_ids.txt`,
the item tables): read one value a line (`read_id_file`, `read_id_map`), and
the digest that tells whether two exports map raw ids alike (`id_map_digest`).
Pure Python: no TensorFlow."""

from __future__ import annotations

import os

from dare_tf._faces import public
from dare_tf.data.storage.spec import ID_MAP_FILES


@public("dare_tf.data")
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


def read_id_file(path: str) -> list[str]:
    """The lines of a dataset's table file (an id map, an item table): UTF-8, one
    value a line, split at line feeds alone (a string id holds spaces and any
    character but a control character: `dare_tf.data.logs.string_ids`)."""
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    return lines[:-1] if lines[-1] == "" else lines  # (the last line's line feed; an empty file: none)


@public("dare_tf.data")
def read_id_map(data_dir: str, kind: str) -> list[str]:
    """Raw ids in dense-id order: element k - 1 is the raw id of dense id k."""
    return read_id_file(os.path.join(data_dir, ID_MAP_FILES[kind]))
