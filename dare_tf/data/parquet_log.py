"""What the log reader (`dare_tf.data.log_reader`) does only for Parquet logs: the
plan of a file's row groups with its column types checked, and a column's
values as int64."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dare_tf.data.logs import LogFormat, LogFormatError, resolved_columns
from dare_tf.data.records import file_sha256


def int64_values(array) -> tuple[np.ndarray, np.ndarray]:
    """A Parquet column's values as int64 (nulls 0), and where an unsigned value is
    past int64's range (the cast would make it negative)."""
    values = np.asarray(array.fill_null(0).to_numpy(zero_copy_only=False))
    huge = values > np.iinfo(np.int64).max if values.dtype == np.uint64 else np.zeros(len(values), bool)
    return values.astype(np.int64), huge



def parquet_plan(path: str, fmt: LogFormat) -> tuple[str, list[tuple[int, int, int]], tuple[str, ...]]:
    """A Parquet log's `BlockPlan` fields: its sha256, its row groups `(group, rows,
    first row number)` and its column names; a column of a type its role cannot
    hold is refused up front."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise LogFormatError(f"{path}: not a Parquet file ({e})") from None
    schema = meta.schema_arrow
    names = tuple(schema.names)
    roles = resolved_columns(fmt, path, names)
    for role, column in roles.items():
        kind = schema.field(column).type
        ok = (pa.types.is_integer(kind) or (role == "time" and (pa.types.is_timestamp(kind) or pa.types.is_date(kind)))
              or (role == "action" and (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                        or pa.types.is_integer(kind) or pa.types.is_dictionary(kind))))
        if not ok:
            expected = "a string or integer type" if role == "action" else "an integer type" + (
                " (or a timestamp)" if role == "time" else "")
            raise LogFormatError(f"{path}: column {column!r} ({role}) has type {kind}; expected {expected}")
    blocks, first = [], 1
    for group in range(meta.num_row_groups):
        rows = meta.metadata.row_group(group).num_rows
        blocks.append((group, rows, first))
        first += rows
    if not blocks or first == 1:
        raise ValueError(f"{path}: input log has no data rows")
    return file_sha256(path), blocks, names
