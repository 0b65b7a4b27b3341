"""String ids (`--string_ids`): SKUs, UUIDs, `N12345`-style ids of users, items,
categories and further fields.

While a log is read, each role's strings get int64 codes in order of first
appearance (`IdVocabulary`), so that preparation computes on integers as it
does for integer ids; the dataset's id maps then hold the strings themselves
(dense id k's string on line k), and an export maps strings through them.

The one rule for every place an id goes (the log's cells, the id maps, the
exports, the client, the history stores, `recommend`, the inspect page): an
id is any non-empty text a cell holds, spaces, `&`, quotes, commas and
non-ASCII letters included (`Pet Supplies`, `Home & Garden`, `Acme Co.`),
without control characters (C0, DEL and C1: a tab, a line break) or the line
and paragraph separators U+2028 and U+2029, so that line k of an id map is one id
for every reader of lines (Python's `str.splitlines` included). Ids are compared
byte for byte, as UTF-8, without Unicode normalization: `café` written with a
combining accent (NFD) and with `é` (NFC) are two ids, as are `Ｉ７` and `I7`.
`007` and `7` are two ids, and so are ` a` and `a`; only an empty cell is
missing. Bytes that are not UTF-8 are refused, never replaced. An empty field
cell is the item's own value: `OWN_PREFIX` (a control character, which no id
holds) and the item's id (`own_value`).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# A field's value for an item without one (an empty cell): this prefix and the item's id. A
# control character, so that no cell can type it (`~` could: `~SKU42` collided with it), and
# not one that Python counts as whitespace (`str.split` and `strip` pass it by; U+001F is).
OWN_PREFIX = "\x01"
# What no string id holds (RE2 and Python `re` syntax alike): control characters, C0, DEL and
# C1 (U+0080-U+009F: NEL, U+0085, is a line break for Python's `str.splitlines`), and the line
# and paragraph separators U+2028 and U+2029 (line breaks there too): whoever reads an id map by
# lines gets id k on line k.
CONTROL = r"[\x00-\x1f\x7f-\x9f" + "\u2028\u2029]"
_CONTROL = re.compile(CONTROL)
NOT_AN_ID = "holds a control character (a string id is any text without tabs, line breaks or other control characters)"
# The longest string id, in characters, in every reader (csv, tsv, Parquet, the histories' appends).
MAX_ID_CHARS = 4096
TOO_LONG = f"is longer than the {MAX_ID_CHARS:,} characters a string id may hold"


def id_problem(text: str, own: bool = False) -> str | None:
    """Why `text` is not a string id (None: it is one); `own`: a field's value, which
    may also be an item's own value (`own_value`)."""
    if own and text.startswith(OWN_PREFIX):
        text = text[len(OWN_PREFIX):]
    if not text:
        return "is empty"
    if len(text) > MAX_ID_CHARS:
        return f"{TOO_LONG} ({len(text):,})"
    if _CONTROL.search(text):
        return NOT_AN_ID
    return None


def not_ids(column):
    """Where a pyarrow string column's values are not string ids: empty, too long, or
    holding a control character (a pyarrow boolean array; nulls stay null)."""
    length = pc.utf8_length(column)
    return pc.or_(pc.or_(pc.equal(length, 0), pc.greater(length, MAX_ID_CHARS)),
                  pc.match_substring_regex(column, CONTROL))


def bad_ids(column) -> bool:
    """Whether any value of a pyarrow string column is not a string id (or is null)."""
    if column.null_count:
        return True
    return bool(pc.any(not_ids(column)).as_py() or False)


class IdVocabulary:
    """One role's string ids -> int64 codes (0, 1, ... in order of first appearance)."""

    def __init__(self):
        self.codes: dict[str, int] = {}

    def code(self, text: str) -> int:
        return self.codes.setdefault(text, len(self.codes))

    def encode(self, column) -> np.ndarray:
        """A pyarrow string column -> int64 codes (nulls: -1)."""
        encoded = (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column).dictionary_encode()
        mapping = np.array([self.code(t) for t in encoded.dictionary.to_pylist()] + [-1], np.int64)
        indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False)
        return mapping[indices]

    def names(self) -> np.ndarray:
        """The strings by code (object array)."""
        out = np.empty(len(self.codes), object)
        out[:] = list(self.codes)
        return out


def as_strings(codes, names: np.ndarray, items: np.ndarray | None = None) -> np.ndarray:
    """Codes -> their strings; a field's own values (`-1 - item code`) -> `own_value`
    of the item (`items`: the item role's strings)."""
    codes = np.asarray(codes, np.int64)
    out = np.empty(len(codes), object)
    real = codes >= 0
    out[real] = names[codes[real]]
    if (~real).any():
        out[~real] = [own_value(t) for t in items[-1 - codes[~real]]]
    return out


def own_value(item: str) -> str:
    """A field's value for an item without one."""
    return OWN_PREFIX + item


def fingerprints(texts) -> np.ndarray:
    """Each string id's int64 fingerprint (the first 8 bytes of its BLAKE2b digest,
    >= 0): the same on every worker, so that the Beam driver groups and counts
    string ids as integers (`fingerprinted`); the id maps are written back in
    the strings, and two ids of one role that share a fingerprint are refused."""
    import hashlib

    return np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big") >> 1
                     for t in texts], np.int64)


def fingerprinted(clicks) -> tuple:
    """A block's `Clicks` (codes, `--string_ids`) with fingerprints for codes (a
    field's own values `-1 - item fingerprint`), and its `(role, fingerprint,
    string)` triples."""
    import dataclasses

    prints = {role: fingerprints(names) for role, names in clicks.names.items()}

    def of(role, codes):
        if role not in prints:  # (no category column: every item's one category, 0)
            return codes
        own = codes < 0
        out = prints[role][np.where(own, 0, codes)] if len(prints[role]) else np.zeros(len(codes), np.int64)
        return np.where(own, -1 - prints["item"][np.where(own, -1 - codes, 0)], out) if own.any() else out

    recoded = dataclasses.replace(clicks, user=of("user", clicks.user), item=of("item", clicks.item),
                                  category=of("category", clicks.category),
                                  fields={n: of(n, v) for n, v in clicks.fields.items()}, names=None)
    return recoded, [(role, int(p), t) for role, names in clicks.names.items() for p, t in zip(prints[role], names)]


def named(triples) -> dict:
    """`{role: {fingerprint: string}}` of the `(role, fingerprint, string)` triples
    of every block (`fingerprinted`); refuses two strings of one role that share
    a fingerprint."""
    out: dict = {}
    for role, fingerprint, text in triples:
        seen = out.setdefault(role, {}).setdefault(fingerprint, text)
        if seen != text:
            raise ValueError(f"the {role} ids {seen!r} and {text!r} share a fingerprint ({fingerprint}): prepare the "
                             "log with --runner=in_memory")
    return out


def from_fingerprints(role: str, raw, names: dict) -> np.ndarray:
    """Fingerprints back to the strings (a field's own values as `own_value`s)."""
    return np.array([names[role][int(v)] if v >= 0 else own_value(names["item"][-1 - int(v)]) for v in raw],
                    object)


def as_string_log(rows: dict) -> dict:
    """A generated log's columns (`dare_tf.data.generation.synthetic.generate`) with string ids
    and ISO 8601 times (`data.synthetic --string_ids`)."""
    import datetime

    def named(prefix, values, width):
        return np.char.add(prefix, np.char.zfill(np.asarray(values).astype(str), width)).astype(object)

    out = dict(rows, user=named("U", rows["user"], 6), item=named("SKU", rows["item"], 7),
               category=named("C", rows["category"], 4),
               timestamp=np.array([datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc)
                                   .strftime("%Y-%m-%dT%H:%M:%SZ") for t in rows["timestamp"]], object))
    if "brand" in rows:
        out["brand"] = named("B", rows["brand"], 3)
    return out
