"""The records' wire format, both ways, with numpy and no TensorFlow: example and
store records encoded as `tf.train.Example`s (`encode_examples`, `encode_store`:
what `dare_tf.data.storage.records.ShardWriter` writes), and store and example shards (TFRecord files,
gzip or not) decoded again (`parse_store`, `parse_examples`): `dare_tf.data.storage.records`
reads every shard with it, TensorFlow loaded or not (faster than tf.data's parser at
every size measured), and its columns are the ones `tf.io.parse_example` gives (tested
against it).

Only this package's own records are decoded: each shard's size and sha256 are
checked against spec.json first (`records.check_file`), so the framing's CRCs are
not checked again.
"""

from __future__ import annotations

import gzip
import re
import struct

import numpy as np

from dare_tf.data.storage.schema import STORE_CLICK_COLUMNS

_TAG_LEN1 = 0x0A  # field 1, length-delimited
_TAG_LEN2 = 0x12  # field 2, length-delimited
_TAG_LEN3 = 0x1A  # field 3 (Feature.int64_list), length-delimited


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`[N, G]` uint8 protobuf varint bytes of int64 `values` (G: the most any
    value needs) and `[N]` their lengths."""
    v = np.ascontiguousarray(values, np.int64).view(np.uint64)
    top = int(v.max()) if len(v) else 0
    width = max(1, -(-top.bit_length() // 7))
    groups = (v[:, None] >> (np.arange(width, dtype=np.uint64) * np.uint64(7))[None, :]) & np.uint64(0x7F)
    n = np.ones(len(v), np.int64)
    for k in range(1, width):
        n[groups[:, k:].any(1)] = k + 1
    more = np.arange(width)[None, :] < (n[:, None] - 1)
    return (groups | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8), n


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_examples(columns: dict[str, np.ndarray]) -> list[bytes]:
    """Serialized `tf.train.Example`s, one per row of the int64 scalar
    `columns` (name -> `[N]`), each feature an `Int64List` of one value.

    Each piece of the wire format gets fixed columns of a padded `[N, W]`
    byte matrix and a mask of the bytes a row uses (varints are shorter than
    their columns); the masked bytes, row after row, are the records."""
    names = list(columns)
    n = len(columns[names[0]]) if names else 0
    if n == 0:
        return []
    pieces: list[tuple[np.ndarray, np.ndarray | None]] = []  # ([N, w] bytes, [N] used or None: all)

    def fixed(*values):
        pieces.append((np.broadcast_to(np.stack([np.broadcast_to(np.asarray(v, np.uint8), (n,)) for v in values], 1),
                                       (n, len(values))), None))

    def size(length):  # a length-delimited field's bytes: its tag, its length as a varint, the content
        return 1 + _varints(length)[1] + length

    features_len = np.zeros(n, np.int64)
    encoded = {}
    for k in names:
        key = k.encode()
        data, value = _varints(np.asarray(columns[k]))  # the packed value: one varint
        int64_list = size(value)  # Int64List{value (packed)}
        feature = size(int64_list)  # Feature{int64_list}
        entry = size(len(key)) + size(feature)  # entry{key, value: Feature}
        encoded[k] = key, data, value, int64_list, feature, entry
        features_len += size(entry)
    fixed(_TAG_LEN1)
    pieces.append(_varints(features_len))
    for key, data, value, int64_list, feature, entry in encoded.values():
        fixed(_TAG_LEN1)
        pieces.append(_varints(entry))
        fixed(_TAG_LEN1, *_varint(len(key)), *key, _TAG_LEN2)
        pieces.append(_varints(feature))
        fixed(_TAG_LEN3)
        pieces.append(_varints(int64_list))
        fixed(_TAG_LEN1)
        pieces.append(_varints(value))
        pieces.append((data, value))
    matrix = np.concatenate([p for p, _ in pieces], 1)
    mask = np.concatenate([np.ones(p.shape, bool) if used is None else
                           np.arange(p.shape[1])[None, :] < used[:, None] for p, used in pieces], 1)
    flat = matrix[mask].tobytes()
    ends = np.cumsum(mask.sum(1)).tolist()
    return [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]


def encode_store(uid: np.ndarray, lengths: np.ndarray, items: np.ndarray, categories: np.ndarray,
                 extra: dict | None = None) -> list[bytes]:
    """Serialized store records: per user, `uid` and its `items` and `categories`
    (`[sum(lengths)]`, user after user), then the `extra` lists (name -> flat
    values as `items`: a dataset's further fields, `dare_tf.data.storage.schema.record_columns`),
    as Int64Lists."""
    lists = {}
    named = {**dict(zip(STORE_CLICK_COLUMNS, (items, categories))), **(extra or {})}
    for name, flat in named.items():
        data, n = _varints(np.asarray(flat))
        keep = np.arange(data.shape[1])[None, :] < n[:, None]
        payload = data[keep].tobytes()  # row-major: each value's bytes in order
        ends = np.cumsum(n)
        lists[name] = (payload, np.concatenate([[0], ends]))
    out, start = [], 0
    for u, length in zip(np.asarray(uid).tolist(), np.asarray(lengths).tolist()):
        entries = [_entry(b"uid", _varint(u))]
        for name in named:
            payload, bounds = lists[name]
            entries.append(_entry(name.encode(), payload[bounds[start]: bounds[start + length]]))
        body = b"".join(entries)
        out.append(bytes([_TAG_LEN1]) + _varint(len(body)) + body)
        start += length
    return out


def _entry(key: bytes, payload: bytes) -> bytes:
    """One Features map entry: `key` -> Feature{int64_list{packed payload}}."""
    int64_list = bytes([_TAG_LEN1]) + _varint(len(payload)) + payload
    feature = bytes([_TAG_LEN3]) + _varint(len(int64_list)) + int64_list
    entry = bytes([_TAG_LEN1]) + _varint(len(key)) + key + bytes([_TAG_LEN2]) + _varint(len(feature)) + feature
    return bytes([_TAG_LEN1]) + _varint(len(entry)) + entry




def tfrecords(path: str, compression: str) -> list[bytes]:
    """The records of a TFRecord file (`compression`: "GZIP" or "")."""
    with (gzip.open(path, "rb") if compression == "GZIP" else open(path, "rb")) as f:
        data = f.read()
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        if at + 16 + length > len(data):
            raise EOFError(f"the record at byte {at} ends past the file's end, byte {len(data)}")
        out.append(data[at + 12: at + 12 + length])
        at += 16 + length  # length, its CRC, the data, its CRC
    return out


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes, at: int, end: int):
    """The length-delimited fields of one message: `(field number, start, end)`."""
    while at < end:
        tag, at = _read_varint(data, at)
        length, at = _read_varint(data, at)
        yield tag >> 3, at, at + length
        at += length


def decode_varints(payload: bytes) -> np.ndarray:
    """Packed protobuf varints -> int64 (two's complement, as int64 values are written)."""
    b = np.frombuffer(payload, np.uint8)
    if not len(b):
        return np.zeros(0, np.int64)
    last = b < 0x80
    starts = np.concatenate([[0], np.flatnonzero(last)[:-1] + 1])
    group = np.concatenate([[0], np.cumsum(last)[:-1]])
    shift = (np.arange(len(b)) - starts[group]).astype(np.uint64) * np.uint64(7)
    values = np.left_shift((b & 0x7F).astype(np.uint64), shift)
    return np.bitwise_or.reduceat(values, starts).view(np.int64)


def parse_store(paths: list[str], compression: str, lists: tuple[str, ...]) -> dict[str, np.ndarray]:
    """`uid` and `length` per user and the flat `lists` (items, categories, ...) of
    the store records of `paths`, in order."""
    uids = []
    payloads: dict[str, list[bytes]] = {name: [] for name in lists}
    keys = {name.encode(): name for name in lists}
    for path in paths:
        for record in tfrecords(path, compression):
            for key, value in _entries(record):
                if key == b"uid":
                    uids.append(value)
                elif key in keys:
                    payloads[keys[key]].append(value)
    columns = {name: decode_varints(b"".join(parts)) for name, parts in payloads.items()}
    # each user's clicks: the varints (bytes < 0x80 end one) of its first list
    ends = np.cumsum([len(p) for p in payloads[lists[0]]], dtype=np.int64)
    done = np.concatenate([[0], np.cumsum(np.frombuffer(b"".join(payloads[lists[0]]), np.uint8) < 0x80)])
    return {"uid": decode_varints(b"".join(uids)), "length": np.diff(done[np.concatenate([[0], ends])]),
            **columns}


def _varints_at(buffer: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The int64 varints that start at byte offsets `at` of `buffer` (uint8, with 10
    bytes of padding past its end)."""
    window = buffer[at[:, None] + np.arange(10)[None, :]]
    ends = (window < 0x80).argmax(1)
    used = np.arange(10)[None, :] <= ends[:, None]
    groups = (window & 0x7F).astype(np.uint64) << (np.arange(10, dtype=np.uint64) * np.uint64(7))[None, :]
    return np.bitwise_or.reduce(np.where(used, groups, np.uint64(0)), axis=1).view(np.int64)


def parse_examples(paths: list[str], compression: str, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The int64 scalar features `names` of the example records of `paths`, in order
    (`encode_examples`' records): each record's one entry per name is found by its
    key's bytes and its value decoded where it starts, all records at once; where a
    name's entries are not one per record (a key's bytes inside a value), record by
    record."""
    records = [r for path in paths for r in tfrecords(path, compression)]
    joined = b"".join(records)
    buffer = np.frombuffer(joined + bytes(10), np.uint8)
    out = {}
    for name in names:
        key = name.encode()
        # entry{key, Feature{Int64List{packed: one varint}}}: each length one byte
        pattern = re.compile(re.escape(bytes([_TAG_LEN1, len(key)]) + key + bytes([_TAG_LEN2]))
                             + b"[\\x00-\\x7f]" + re.escape(bytes([_TAG_LEN3])) + b"[\\x00-\\x7f]"
                             + re.escape(bytes([_TAG_LEN1])) + b"[\\x00-\\x7f]", re.S)
        at = np.fromiter((m.end() for m in pattern.finditer(joined)), np.int64)
        if len(at) != len(records):
            return _parse_examples_slowly(records, names)
        out[name] = _varints_at(buffer, at)
    return out


def _parse_examples_slowly(records: list[bytes], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    values = {name: np.zeros(len(records), np.int64) for name in names}
    keys = {name.encode(): name for name in names}
    for row, record in enumerate(records):
        for key, value in _entries(record):
            if key in keys:
                values[keys[key]][row] = decode_varints(value)[0]
    return values


def _entries(record: bytes):
    """`(key, packed int64 payload)` of each entry of one Example record."""
    for _, start, end in _fields(record, 0, len(record)):  # Example.features
        for _, e_start, e_end in _fields(record, start, end):  # one map entry
            key = value = None
            for number, f_start, f_end in _fields(record, e_start, e_end):
                if number == 1:
                    key = record[f_start:f_end]
                else:  # Feature -> int64_list (3) -> packed value (1)
                    for _, l_start, l_end in _fields(record, f_start, f_end):
                        for _, v_start, v_end in _fields(record, l_start, l_end):
                            value = record[v_start:v_end]
            yield key, value or b""
