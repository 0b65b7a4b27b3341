"""LmdbStore: the embedded history store, one LMDB environment in a directory.

Each user is one record, key the 8-byte big-endian user id, value its clicks as
packed little-endian int64 `(time, item, category)` triples (`CLICK`; with
further fields, their values after them: `click_dtype`), oldest first. A read
is one memory-mapped lookup per user; an append rewrites the user's record in
one write transaction (LMDB commits are atomic and synced).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterator

import lmdb
import numpy as np

from dare_tf.histories.base import DEFAULT_MAX_CLICKS, HistoryStore, StoreError, merged

_META = b"meta"
_FORMAT = "dare_tf.histories/1"
# Virtual address space the memory map may grow to (a sparse file: disk grows with the data).
MAP_SIZE = 1 << 40


def _key(user: int) -> bytes:
    return struct.pack(">q", user)


# LMDB's meta pages (pages 0 and 1, `lmdb.h`'s MDB_meta after a 16-byte page header):
# the magic, the page size (the free database's md_pad), the last page used and
# the transaction id; the meta of the higher transaction id is the current one.
_MAGIC, _MAGIC_AT, _PAGE_SIZE_AT, _LAST_PAGE_AT = 0xBEEFC0DE, 16, 40, 136


def _check_size(url: str, data: str) -> None:
    """Refuses a `data.mdb` shorter than its own meta page records (a truncated copy):
    mapping it would end the process with SIGBUS at the first read past its end."""
    size = os.path.getsize(data)
    with open(data, "rb") as f:
        head = f.read(_LAST_PAGE_AT + 16)
        metas = []
        if len(head) == _LAST_PAGE_AT + 16 and struct.unpack_from("<I", head, _MAGIC_AT)[0] == _MAGIC:
            page = struct.unpack_from("<I", head, _PAGE_SIZE_AT)[0]
            f.seek(page)
            second = f.read(_LAST_PAGE_AT + 16)
            metas = [struct.unpack_from("<QQ", m, _LAST_PAGE_AT) for m in (head, second)
                     if len(m) == _LAST_PAGE_AT + 16 and struct.unpack_from("<I", m, _MAGIC_AT)[0] == _MAGIC]
    if not metas:
        raise StoreError(f"{url}: the store is damaged: {data} does not start with LMDB's meta page (restore it "
                         "from a copy, or load it anew with serving.histories load)")
    need = (max(metas, key=lambda m: m[1])[0] + 1) * page
    if size < need:
        raise StoreError(f"{url}: the store is damaged: {data} holds {size:,} bytes but its meta page records "
                         f"{need:,} (a truncated copy?); restore it from a copy, or load it anew with "
                         "serving.histories load")


# LMDB refuses a key over 511 bytes (MDB_BAD_VALSIZE): a longer string id is keyed by its
# digest behind a NUL byte, which no string id holds (`dare_tf.data.logs.string_ids`).
_MAX_KEY_BYTES = 511


def _id_key(text: str) -> bytes:
    """The `ids` database's key of a string id: its UTF-8 bytes, or a digest of a long one."""
    import hashlib

    key = text.encode()
    return key if len(key) <= _MAX_KEY_BYTES else b"\x00" + hashlib.blake2b(key, digest_size=32).digest()


def _damaged(url: str, error: Exception) -> StoreError:
    return StoreError(f"{url}: the store is damaged ({type(error).__name__}: {error}); restore it from a copy, or "
                      "load it anew with serving.histories load")


class LmdbStore(HistoryStore):
    """The history store in the LMDB environment at `path` (see `dare_tf.histories`)."""

    def __init__(self, path: str, read_only: bool = False, max_clicks: int | None = None, fields=None,
                 string_ids: bool | None = None):
        self.url, self.read_only = f"lmdb:{path}", read_only
        exists = os.path.exists(os.path.join(path, "data.mdb"))
        if not exists and (read_only or (os.path.isdir(path) and os.listdir(path))):
            raise StoreError(f"{self.url}: not a history store (no data.mdb in {path}); "
                             + ("nothing to read" if read_only else "give an empty or new directory"))
        if os.path.exists(path) and not os.path.isdir(path):
            raise StoreError(f"{self.url}: {path} is a file; a history store is a directory")
        if exists:
            _check_size(self.url, os.path.join(path, "data.mdb"))
        try:
            self.env = lmdb.open(path, map_size=MAP_SIZE, max_dbs=4, readonly=read_only, subdir=True,
                                 create=not read_only, lock=True)
        except lmdb.Error as e:
            raise StoreError(f"{self.url}: cannot open the store ({e})") from e
        try:
            self._open(exists, read_only, max_clicks, fields, string_ids)
        except BaseException:
            self.env.close()  # (a store that cannot be used is closed: this process may open it again)
            raise

    def _open(self, exists: bool, read_only: bool, max_clicks, fields, string_ids) -> None:
        """The store's databases and config (an existing store's opened, never created: a damaged
        one is not written to)."""
        try:
            self.meta = self.env.open_db(_META, create=not exists)
            self.clicks = self.env.open_db(b"clicks", create=not exists)
        except lmdb.Error as e:
            raise StoreError(f"{self.url}: the store is damaged, or not a history store written by dare_tf "
                             f"({type(e).__name__}: {e}); restore it from a copy, or load it anew with "
                             "serving.histories load") from e
        try:
            with self.env.begin(db=self.meta, write=not read_only) as txn:
                stored = txn.get(b"config")
                if stored is None:
                    if read_only:
                        raise StoreError(f"{self.url}: not a history store written by dare_tf (no config)")
                    config = {"format": _FORMAT, "max_clicks": max_clicks or DEFAULT_MAX_CLICKS,
                              **({"fields": list(fields)} if fields else {}),
                              **({"string_ids": True} if string_ids else {})}
                    txn.put(b"config", json.dumps(config).encode())
                else:
                    config = json.loads(stored)
                    if not isinstance(config, dict) or config.get("format") != _FORMAT:
                        raise StoreError(f"{self.url}: a store of format "
                                         f"{config.get('format') if isinstance(config, dict) else None!r}, "
                                         f"expected {_FORMAT}")
        except (lmdb.Error, ValueError) as e:
            raise e if isinstance(e, StoreError) else _damaged(self.url, e) from e
        self._configured(config, fields, string_ids)
        if self.string_ids:  # (string id -> code, code -> string id)
            try:
                self.ids = self.env.open_db(b"ids", create=not read_only)
                self.names = self.env.open_db(b"names", create=not read_only)
            except lmdb.Error as e:
                raise _damaged(self.url, e) from e

    def _intern(self, texts: list[str], create: bool) -> np.ndarray:
        out = np.empty(len(texts), np.int64)
        with self.env.begin(write=create) as txn:
            fresh = txn.stat(self.names)["entries"] + 1
            for i, text in enumerate(texts):
                key = _id_key(text)
                code = txn.get(key, db=self.ids)
                if code is None and create:
                    code = _key(fresh)
                    txn.put(key, code, db=self.ids)
                    txn.put(code, text.encode(), db=self.names)
                    fresh += 1
                out[i] = -1 if code is None else struct.unpack(">q", code)[0]
        return out

    def _texts(self, codes) -> list[str]:
        with self.env.begin(db=self.names) as txn:
            return [bytes(txn.get(_key(int(c)))).decode() for c in codes]

    def append_many(self, by_user: dict[int, np.ndarray]) -> dict[int, int]:
        self._writable()
        lengths = {}
        with self.env.begin(db=self.clicks, write=True) as txn:
            for user, new in by_user.items():
                packed = merged(txn.get(_key(user)), new, self.max_clicks)
                txn.put(_key(user), packed)
                lengths[user] = len(packed) // self.dtype.itemsize
        return lengths

    def _read(self, users: list[int], max_len: int | None) -> list[np.ndarray]:
        try:
            with self.env.begin(db=self.clicks, buffers=True) as txn:
                # (the last max_len copied inside the transaction: its buffers are valid only there)
                return [np.frombuffer(v, self.dtype)[-max_len if max_len else 0:].copy()
                        if (v := txn.get(_key(u))) is not None else np.zeros(0, self.dtype) for u in users]
        except (lmdb.Error, ValueError) as e:  # (a record that is not whole clicks: ValueError)
            raise _damaged(self.url, e) from e

    def note(self, name: str, value: str | None = None) -> str | None:
        if value is not None:
            self._writable()
        with self.env.begin(db=self.meta, write=value is not None) as txn:
            if value is not None:
                txn.put(b"note:" + name.encode(), value.encode())
            stored = txn.get(b"note:" + name.encode())
        return None if stored is None else bytes(stored).decode()

    def size(self, user) -> int:
        with self.env.begin(db=self.clicks, buffers=True) as txn:
            value = txn.get(_key(self._user(user)))
            return 0 if value is None else len(value) // self.dtype.itemsize

    def _users(self) -> Iterator[int]:
        with self.env.begin(db=self.clicks) as txn:
            for key in txn.cursor().iternext(keys=True, values=False):
                yield struct.unpack(">q", key)[0]

    def __len__(self) -> int:
        with self.env.begin(db=self.clicks) as txn:
            return txn.stat(self.clicks)["entries"]

    def close(self) -> None:
        self.env.close()
