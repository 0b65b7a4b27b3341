"""A history store filled from the package's data, in raw ids: a prepared
dataset's per-user click sequences (`load_prepared`), or the clicks of a
log file read as `data.prepare` reads it (`append_log`)."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.storage.fields import field_id_file
from dare_tf.data.preparation.dataset_dir import verify_tables
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.id_maps import read_id_file, read_id_map
from dare_tf.data.storage.store import SequenceStore
from dare_tf.histories.base import HistoryStore, StoreError

# The store's notes of `load_prepared`: the dataset (its preparation id) a load began, and finished, filling it from.
LOADING, LOADED = "loading", "loaded"
# Users written per atomic append.
USERS_PER_WRITE = 10_000


class Loaded(NamedTuple):
    """What `load_prepared` did: users loaded, their clicks in the dataset, and the
    clicks the store kept (each user's last `max_clicks`)."""

    users: int
    clicks: int
    kept: int


def load_prepared(store: HistoryStore, data_dir: str) -> Loaded:
    """Fills the empty `store` with every stored user's clicks of the prepared
    dataset `data_dir` (dense ids mapped back to raw through its id maps, and its
    column fields' values, which `store` must hold); returns `Loaded`, with
    every click's time from the log (a dataset prepared before its store kept
    them, without `--time_gap`, has none: 0, which `recommend` and the inspect
    page read as "time unknown").

    Idempotent: the store records the dataset it was filled from (its
    preparation id), and loading that dataset again does nothing and returns
    `Loaded(0, 0, 0)`. A store that holds clicks of anything else (another dataset, live
    clicks, a load that was killed) is refused: loading into it would add its
    users' clicks twice."""
    spec = DatasetSpec.load(data_dir)
    verify_tables(data_dir, spec)
    if store.fields != spec.field_schema.columns:
        raise StoreError(f"{store.url}: its clicks have the fields {list(store.fields)}, but {data_dir} has "
                         f"{list(spec.field_schema.columns)}: load it into a store created with them")
    _same_ids(store, spec.string_ids, data_dir)
    if store.note(LOADED) == spec.preparation:
        return Loaded(0, 0, 0)
    if len(store):
        started = store.note(LOADING)
        why = (f"a load of {started.split(' ', 1)[1]} that did not finish" if started and not store.note(LOADED)
               else "clicks loaded or appended before")
        raise StoreError(f"{store.url}: holds {len(store):,} users already ({why}); a load fills an empty store, "
                         "since loading into this one would add clicks twice: give a new store")
    store.note(LOADING, f"{spec.preparation} {os.path.abspath(data_dir)}")
    sequences = SequenceStore.load(data_dir, spec, click_times=True)
    # Raw ids by dense id (a store of string ids: its codes of them)
    raw = {kind: np.concatenate([[0], store.codes(kind, read_id_map(data_dir, kind) if spec.string_ids else
                                                  [int(r) for r in read_id_map(data_dir, kind)])])
           for kind in ("item", "category", "user")}
    for name in store.fields:
        values = read_id_file(os.path.join(data_dir, field_id_file(name)))
        raw[name] = np.concatenate([[0], store.codes(name, values if spec.string_ids else
                                                     [int(r) for r in values])])
    users = np.flatnonzero(sequences.length)
    for first in range(0, len(users), USERS_PER_WRITE):
        batch = {}
        for dense_user in users[first:first + USERS_PER_WRITE]:
            start, length = sequences.start[dense_user], sequences.length[dense_user]
            rows = np.zeros(length, store.dtype)
            rows["item"] = raw["item"][sequences.items[start:start + length]]
            rows["category"] = raw["category"][sequences.categories[start:start + length]]
            for name in store.fields:
                rows[name] = raw[name][sequences.fields[name][start:start + length]]
            if sequences.click_times is not None:
                rows["time"] = sequences.click_times[start:start + length]
            batch[int(raw["user"][dense_user])] = rows
        store.append_many(batch)
    store.note(LOADED, spec.preparation)
    lengths = sequences.length[users]
    return Loaded(len(users), int(lengths.sum()), int(np.minimum(lengths, store.max_clicks).sum()))


def append_log(store: HistoryStore, path: str, fmt) -> int:
    """Appends the clicks of the log file `path` (its `LogFormat`: a preset or
    custom columns, with the store's further fields) to `store`: `append_clicks`
    of what it reads; returns the clicks appended."""
    from dare_tf.data.logs.reader import read_clicks

    return append_clicks(store, read_clicks(path, fmt), path)


def append_clicks(store: HistoryStore, read, source: str) -> int:
    """Appends the rows `read` (`dare_tf.data.logs.formats.Clicks`, raw ids, of the log
    `source`: an impression log's clicked ones only) to `store`, each user's in
    their order, `USERS_PER_WRITE` users per atomic append; returns the clicks
    appended."""
    from dare_tf.histories.base import clicks

    _same_ids(store, read.names is not None, source)
    if store.string_ids:  # (the log's codes -> the store's: each distinct string once)
        read = _in_store_codes(store, read)
    rows = np.arange(len(read.user)) if read.label is None else np.flatnonzero(read.label == 1)
    order = rows[np.argsort(read.user[rows], kind="stable")]  # each user's rows together, in their order
    users, first = np.unique(read.user[order], return_index=True)
    groups = np.split(order, first[1:])
    done = 0
    for start in range(0, len(users), USERS_PER_WRITE):
        batch = groups[start:start + USERS_PER_WRITE]
        try:
            store.append_many({int(user): clicks(read.item[rows], read.category[rows], read.time[rows],
                                                 {n: v[rows] for n, v in read.fields.items()}, store.fields)
                               for user, rows in zip(users[start:start + USERS_PER_WRITE], batch)})
        except StoreError as e:
            done += sum(getattr(e, "appended", {}).values())  # (the batch's users acknowledged before it)
            unconfirmed = sum(getattr(e, "unconfirmed", {}).values())
            raise AppendError(
                f"{e}; {done} of the {len(order)} clicks of {source} were appended before it"
                + (f" and {unconfirmed} more are on their masters, not confirmed" if unconfirmed else "")
                + ", each user's whole or not at all"
                + ("; sending the same lines again appends each user's clicks once" if store.resend_safe else ""),
                done + unconfirmed) from None
        done += sum(len(rows) for rows in batch)
    return len(order)


def _same_ids(store: HistoryStore, strings: bool, source: str) -> None:
    if store.string_ids != strings:
        kinds = {True: "string ids (--string_ids)", False: "integer ids"}
        raise StoreError(f"{store.url}: the store keeps {kinds[store.string_ids]}, but {source} has "
                         f"{kinds[strings]}: use a store of its kind")


def _in_store_codes(store: HistoryStore, read):
    """`read` (`Clicks` with `--string_ids`) with its ids recoded as the store's."""
    import dataclasses

    def recoded(role, codes):
        distinct, inverse = np.unique(codes, return_inverse=True)
        values = read.raw(role, distinct)
        if role == ACTION_FIELD:  # (an action is its code, kept as text as `load` reads it from the id map: "2")
            values = [str(int(code)) for code in values]
        return store.codes(role, values)[inverse]

    return dataclasses.replace(read, user=recoded("user", read.user), item=recoded("item", read.item),
                               category=recoded("category", read.category),
                               fields={n: recoded(n, v) for n, v in read.fields.items()})


class AppendError(StoreError):
    """An append that failed part of the way; `appended`: the clicks it wrote before."""

    def __init__(self, message: str, appended: int):
        super().__init__(message)
        self.appended = appended
