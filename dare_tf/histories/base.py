"""The history service's interface (`HistoryStore`), its records and checks;
the stores and `open_store` are in `dare_tf.histories`."""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Iterator, Sequence

import numpy as np

from dare_tf.ids import as_int64

# Clicks kept per user when a store is created without `max_clicks`.
DEFAULT_MAX_CLICKS = 10_000


class StoreError(ValueError):
    """A store that cannot be opened or used as asked (one line: the store and what was expected)."""


class PartialAppend(StoreError):
    """An `append_many` that stopped part of the way: `appended`, user -> clicks of the
    users whose appends were acknowledged; `unconfirmed`, those whose clicks reached
    their master without the replicas asked for."""

    def __init__(self, message: str, appended: dict, unconfirmed: dict):
        super().__init__(message)
        self.appended, self.unconfirmed = appended, unconfirmed


@dataclasses.dataclass
class Histories:
    """Users' last clicks as `last` returns them: raw `items`, `categories` and
    `times` `[U, T]`, oldest first, each row's clicks first and padding (0) after
    them, and each row's `lengths` `[U]` (T = the longest, at least 1): the `rank`
    signature's layout. `fields`: the store's further fields' raw values, each
    `[U, T]` the same way."""

    items: np.ndarray
    categories: np.ndarray
    times: np.ndarray
    lengths: np.ndarray
    fields: dict = dataclasses.field(default_factory=dict)

    def row(self, user: int) -> tuple[np.ndarray, np.ndarray]:
        """The `user`-th row's items and categories, without padding."""
        n = self.lengths[user]
        return self.items[user, :n], self.categories[user, :n]

    def row_fields(self, user: int) -> dict[str, np.ndarray]:
        """The `user`-th row's further fields' values, without padding."""
        return {name: values[user, :self.lengths[user]] for name, values in self.fields.items()}

    def to_json(self, user: int, user_id) -> dict:
        n = self.lengths[user]
        return {"user_id": user_id if isinstance(user_id, str) else int(user_id),
                "items": self.items[user, :n].tolist(),
                "categories": self.categories[user, :n].tolist(), "times": self.times[user, :n].tolist(),
                **{name: values.tolist() for name, values in self.row_fields(user).items()}}


def merged(stored: bytes | None, new: np.ndarray, cap: int) -> bytes:
    """A user's stored clicks (packed records of `new`'s dtype, or None) then
    `new`, in time order, ties in arrival order, the last `cap` kept, packed again."""
    old = np.frombuffer(stored, new.dtype) if stored else np.zeros(0, new.dtype)
    both = np.concatenate([old, new])
    tail = both["time"][max(len(old) - 1, 0):]  # (old is in order already)
    if (np.diff(tail) < 0).any():
        both = both[np.argsort(both["time"], kind="stable")]
    return both[-cap:].tobytes()


# One click as a store holds it (a store with further fields: `click_dtype`).
CLICK = np.dtype([("time", "<i8"), ("item", "<i8"), ("category", "<i8")])


def click_dtype(fields=()) -> np.dtype:
    """A click's record in a store with further `fields` (their raw values after `CLICK`'s)."""
    return np.dtype(CLICK.descr + [(name, "<i8") for name in fields]) if fields else CLICK


def clicks(items, categories, times, fields: dict | None = None, names=()) -> np.ndarray:
    """Checked click records of equal-length id and time lists, with the values of
    the store's further fields `names` (`fields`: name -> values; exactly those)."""
    fields = fields or {}
    if set(fields) != set(names):
        missing, extra = sorted(set(names) - set(fields)), sorted(set(fields) - set(names))
        raise StoreError("append: the store's clicks have the fields " + (", ".join(names) or "none")
                         + "".join([f"; missing {', '.join(missing)}"] * bool(missing)
                                   + [f"; not in the store: {', '.join(extra)}"] * bool(extra)))
    columns = {"item": items, "category": categories, "time": times, **fields}
    lists = {"item": "items", "category": "categories", "time": "times"}
    columns = {n: as_int64(lists.get(n, n), v, StoreError).reshape(-1) for n, v in columns.items()}
    if len({len(v) for v in columns.values()}) > 1:
        raise StoreError(f"append: {len(columns['item'])} items, {len(columns['category'])} categories and "
                         f"{len(columns['time'])} times" + "".join(f", {len(columns[n])} {n}" for n in names)
                         + "; one of each per click")
    out = np.empty(len(columns["item"]), click_dtype(names))
    for name, values in columns.items():
        out[name] = values
    return out


class HistoryStore(abc.ABC):
    """Every user's clicks, by raw user id. See the module for the semantics.

    Attributes:
        url: the store's URL (`lmdb:DIR`, `redis://HOST:PORT`).
        max_clicks: clicks kept per user (the oldest dropped).
        read_only: opened for reading only (`append` refused).
        fields: the further fields every click holds (set when the store is
            created, recorded in it), and `dtype`, a click's record.
        string_ids: user, item, category and field ids are strings
            (`--string_ids`; set when the store is created): the store keeps
            each string's int64 code (`codes`), and `last` and `users` answer
            in the strings.
        resend_safe: an append of the same clicks sent again is applied once
            (the Redis Cluster store's; the others append atomically, whole or
            not at all).
    """

    url: str
    max_clicks: int
    read_only: bool
    fields: tuple[str, ...] = ()
    string_ids: bool = False
    resend_safe: bool = False

    @property
    def dtype(self) -> np.dtype:
        return click_dtype(self.fields)

    def append(self, user, items: Sequence[int], categories: Sequence[int], times: Sequence[int],
               fields: dict | None = None) -> int:
        """Adds one user's clicks (any order; kept in time order), with the values of
        the store's further `fields`; returns the user's number of clicks after it."""
        user = self._user(user, create=True)
        if self.string_ids:
            items, categories = self.codes("items", items), self.codes("categories", categories)
            fields = {name: self.codes(name, values) for name, values in (fields or {}).items()}
        return self.append_many({user: clicks(items, categories, times, fields, self.fields)})[user]

    def codes(self, name: str, values, create: bool = True) -> np.ndarray:
        """String ids -> the store's int64 codes of them (new ones numbered when
        `create`, else -1), refusing what is not a string id in one line; a store
        of integer ids: the ids, checked."""
        if not self.string_ids:
            return as_int64(name, values, StoreError).reshape(-1)
        from dare_tf.data.logs.string_ids import id_problem

        texts = [v for v in np.asarray(values, object).reshape(-1)]
        for text in texts:
            problem = "is not a string" if not isinstance(text, str) else id_problem(text, own=name in self.fields)
            if problem:
                raise StoreError(f"{name}: {text!r} {problem} (the store {self.url} keeps string ids)")
        if create:
            self._writable()
        return self._intern(texts, create) if texts else np.zeros(0, np.int64)

    def _intern(self, texts: list[str], create: bool) -> np.ndarray:
        """The codes of string ids (`string_ids` stores)."""
        raise NotImplementedError

    def _texts(self, codes) -> list[str]:
        """The string ids of codes (`string_ids` stores)."""
        raise NotImplementedError

    def _decoded(self, values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """`[U, T]` codes -> their strings, padding ""."""
        out = np.full(values.shape, "", object)
        real = np.arange(values.shape[1])[None, :] < lengths[:, None]
        if real.any():
            out[real] = self._texts(values[real].tolist())
        return out

    @abc.abstractmethod
    def append_many(self, by_user: dict[int, np.ndarray]) -> dict[int, int]:
        """Adds `CLICK` records per user in one atomic write; returns each user's length after."""

    @abc.abstractmethod
    def _read(self, users: list[int], max_len: int | None) -> list[np.ndarray]:
        """Each user's last `max_len` (None: all) `CLICK` records, oldest first
        (empty for an unknown user)."""

    def last(self, users: Sequence[int], max_len: int | None = None) -> Histories:
        """The last `max_len` clicks (default all kept) of each user, oldest first."""
        if max_len is not None and max_len < 1:
            raise StoreError(f"last: max_len must be >= 1, got {max_len}")
        rows = self._read([self._user(u) for u in users], max_len)
        lengths = np.array([len(r) for r in rows], np.int64)
        width = max(int(lengths.max(initial=0)), 1)
        out = {field: np.zeros((len(rows), width), np.int64) for field in ("item", "category", "time", *self.fields)}
        for u, clicks in enumerate(rows):  # (contiguous int64 rows: a copy per field and user)
            for field, array in out.items():
                array[u, :len(clicks)] = clicks[field]
        if self.string_ids:
            out.update({f: self._decoded(out[f], lengths) for f in ("item", "category", *self.fields)})
        return Histories(out["item"], out["category"], out["time"], lengths, {n: out[n] for n in self.fields})

    @abc.abstractmethod
    def note(self, name: str, value: str | None = None) -> str | None:
        """The store's record `name` (what `serving.histories load` filled it from), set
        to `value` first when one is given."""

    @abc.abstractmethod
    def size(self, user) -> int:
        """Clicks held for `user` (0 for an unknown user)."""

    def users(self) -> Iterator:
        """Every user with clicks (their string ids in a `string_ids` store)."""
        if not self.string_ids:
            yield from self._users()
            return
        codes = list(self._users())
        for start in range(0, len(codes), 10_000):
            yield from self._texts(codes[start:start + 10_000])

    @abc.abstractmethod
    def _users(self) -> Iterator[int]:
        """Every user with clicks, by code."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _user(self, user, create: bool = False) -> int:
        """A user's key: the id, or in a `string_ids` store its code (-1: none yet)."""
        return int(self.codes("user_id", [user], create)[0])

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.url}: opened read-only; open it for writing to append")

    def _configured(self, config: dict, fields, string_ids: bool | None = None) -> None:
        """Takes `max_clicks`, `fields` and `string_ids` from the store's recorded
        config; refuses other `fields` or ids asked of an existing store (None:
        whatever it holds)."""
        try:
            self.max_clicks = int(config["max_clicks"])
        except (KeyError, TypeError, ValueError):
            raise StoreError(f"{self.url}: the store is damaged: its recorded config {json.dumps(config)} has no "
                             "max_clicks; restore it from a copy, or load it anew with serving.histories "
                             "load") from None
        self.fields = tuple(config.get("fields", ()))
        self.string_ids = bool(config.get("string_ids", False))
        if string_ids is not None and string_ids != self.string_ids:
            kinds = {True: "string ids (--string_ids)", False: "integer ids"}
            raise StoreError(f"{self.url}: the store keeps {kinds[self.string_ids]}, not {kinds[string_ids]}: a "
                             "store keeps the ids it was created with; use another store")
        if fields is not None and tuple(fields) != self.fields:
            missing = [name for name in self.fields if name not in fields]
            how = (f"read {', '.join(missing)} from the log too (a preset's log: --fields="
                   f"{','.join(self.fields)}; --columns: " + ",".join(f"field:{n}=COLUMN" for n in missing)
                   + ") or use another store") if missing else "use another store"
            raise StoreError(f"{self.url}: the store's clicks have the fields {list(self.fields)}, not "
                             f"{list(fields)}: a store keeps the fields it was created with; {how}")
