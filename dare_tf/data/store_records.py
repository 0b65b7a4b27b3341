"""Store shards read without TensorFlow: the records `dare_tf.data.records.encode_store`
writes (TFRecord files, gzip or not, of `tf.train.Example`s holding `uid` and the
Int64Lists of each user's clicks), parsed with numpy, for the programs that run
without TensorFlow's start-up (`data.prepare --append`). `dare_tf.data.records`
reads with it where TensorFlow is not loaded; the columns are the ones
`tf.io.parse_example` gives (tested against it).

Only this package's own store records are read: each shard's size and sha256 are
checked against spec.json first (`records.check_file`), so the framing's CRCs are
not checked again.
"""

from __future__ import annotations

import gzip
import struct

import numpy as np


def tfrecords(path: str, compression: str) -> list[bytes]:
    """The records of a TFRecord file (`compression`: "GZIP" or "")."""
    with (gzip.open(path, "rb") if compression == "GZIP" else open(path, "rb")) as f:
        data = f.read()
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        out.append(data[at + 12: at + 12 + length])
        at += 16 + length  # length, its CRC, the data, its CRC
    return out


def _varint(data: bytes, at: int) -> tuple[int, int]:
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
        tag, at = _varint(data, at)
        length, at = _varint(data, at)
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
                    value = value or b""
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
