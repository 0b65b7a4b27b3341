"""A history store filled from the package's data, in raw ids: a prepared
dataset's per-user click sequences (`load_prepared`), or the clicks of a
log file read as `data.prepare` reads it (`append_log`)."""

from __future__ import annotations

import numpy as np

from dare_tf.data.spec import DatasetSpec, read_id_map
from dare_tf.data.store import SequenceStore
from dare_tf.histories.base import CLICK, HistoryStore

# Users written per atomic append.
USERS_PER_WRITE = 10_000


def load_prepared(store: HistoryStore, data_dir: str) -> tuple[int, int]:
    """Appends every stored user's clicks of the prepared dataset `data_dir` (dense ids
    mapped back to raw through its id maps) to `store`; returns (users, clicks). A
    prepared dataset keeps no click times: they are 0, before any live click."""
    spec = DatasetSpec.load(data_dir)
    sequences = SequenceStore.load(data_dir, spec)
    raw = {kind: np.array([0] + [int(r) for r in read_id_map(data_dir, kind)], np.int64)
           for kind in ("item", "category", "user")}
    users = np.flatnonzero(sequences.length)
    for first in range(0, len(users), USERS_PER_WRITE):
        batch = {}
        for dense_user in users[first:first + USERS_PER_WRITE]:
            start, length = sequences.start[dense_user], sequences.length[dense_user]
            rows = np.zeros(length, CLICK)
            rows["item"] = raw["item"][sequences.items[start:start + length]]
            rows["category"] = raw["category"][sequences.categories[start:start + length]]
            batch[int(raw["user"][dense_user])] = rows
        store.append_many(batch)
    return len(users), int(sequences.length.sum())


def append_log(store: HistoryStore, path: str, fmt) -> int:
    """Appends the clicks of the log file `path` (its `LogFormat`: a preset or
    custom columns; only clicks are kept) to `store`, each user's in file order,
    `USERS_PER_WRITE` users per atomic append; returns the clicks appended."""
    from dare_tf.data.log_reader import read_clicks
    from dare_tf.histories.base import clicks

    read = read_clicks(path, fmt)
    order = np.argsort(read.user, kind="stable")  # each user's rows together, in file order
    users, first = np.unique(read.user[order], return_index=True)
    groups = np.split(order, first[1:])
    for start in range(0, len(users), USERS_PER_WRITE):
        store.append_many({int(user): clicks(read.item[rows], read.category[rows], read.time[rows])
                           for user, rows in zip(users[start:start + USERS_PER_WRITE],
                                                 groups[start:start + USERS_PER_WRITE])})
    return len(read.user)
