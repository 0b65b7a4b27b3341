"""What the log reader (`dare_tf.data.logs.reader`) does only for Parquet logs: the
plan of a file's row groups with its column types checked, and a column's
values as int64."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dare_tf.data.logs.formats import FIELD_ROLE, LogFormat, LogFormatError, resolved_columns

from dare_tf.data.logs.clicks import own_values
from dare_tf.data.logs.string_ids import NOT_AN_ID, id_problem, not_ids
from dare_tf._files import file_sha256
from dare_tf.data.logs.times import TIME_UNITS, time_column


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
        text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        if fmt.string_ids and (role in ("user", "item", "category") or role.startswith(FIELD_ROLE)):
            if not text:
                raise LogFormatError(f"{path}: column {column!r} ({role}) has type {kind}; --string_ids reads ids "
                                     "from a string column")
            continue
        ok = (pa.types.is_integer(kind) or (role == "time" and (pa.types.is_timestamp(kind) or pa.types.is_date(kind)
                                                                or pa.types.is_string(kind)
                                                                or pa.types.is_large_string(kind)))
              or (role == "action" and (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                        or pa.types.is_integer(kind) or pa.types.is_dictionary(kind))))
        if not ok:
            expected = "a string or integer type" if role == "action" else "an integer type" + (
                " (or a timestamp, a date or text)" if role == "time" else "")
            raise LogFormatError(f"{path}: column {column!r} ({role}) has type {kind}; expected {expected}")
    blocks, first = [], 1
    for group in range(meta.num_row_groups):
        rows = meta.metadata.row_group(group).num_rows
        blocks.append((group, rows, first))
        first += rows
    if not blocks or first == 1:
        raise ValueError(f"{path}: input log has no data rows")
    return file_sha256(path), blocks, names


def _not_ids(column) -> np.ndarray:
    """Where a string column's values are not string ids (`not_ids`; nulls: False)."""
    return np.asarray(not_ids(column).fill_null(False).to_numpy(zero_copy_only=False))


def _why(column, wrong: np.ndarray) -> str:
    """Why the first of a string column's `wrong` values is not a string id (`id_problem`)."""
    return id_problem(column[int(np.flatnonzero(wrong)[0])].as_py() or "") or NOT_AN_ID


def _role_values(reader, role: str, column, reasons: dict) -> tuple[np.ndarray, np.ndarray]:
    """A role's int64 values in a row group (string ids encoded, times read) and its
    bad rows; `reasons[role]` updated to say why they are bad."""
    if role in reader.vocab:
        wrong = _not_ids(column)
        if wrong.any() and not reasons[role][0][wrong].all():
            reasons[role] = (reasons[role][0] | wrong, _why(column, wrong))
        return reader.vocab[role].encode(column), wrong
    if role == "time" and not pa.types.is_integer(column.type):  # timestamps, dates, text
        values = time_column(column, **reader.fmt.time_options)
        if values is not None:
            return values, np.zeros(len(column), bool)
        # (a value that is not a time: the first is named)
        ok = [time_column(column.slice(i, 1), **reader.fmt.time_options) is not None for i in range(len(column))]
        reasons[role] = (reasons[role][0] | ~np.array(ok), "is not a time")
        return np.zeros(len(column), np.int64), reasons[role][0]
    values, huge = int64_values(column)
    if role == "time":
        values = values // TIME_UNITS[reader.fmt.time_unit]
    wrong = (values < 0) if role != "label" else ~np.isin(values, (0, 1))
    if wrong.any() and not reasons[role][0][wrong].all():
        reasons[role] = (reasons[role][0] | wrong, "must be 0 or 1" if role == "label" else "is negative")
    if huge.any():  # (an unsigned id past int64: not to be read as a negative one)
        reasons[role] = (huge, "does not fit a 64-bit integer")
    return values, wrong | huge


def _field_values(reader, role: str, column, items: np.ndarray, reasons: dict) -> tuple[np.ndarray, np.ndarray]:
    """A further field's int64 values in a row group (null or empty: the item's own
    value, `own_values`) and its bad rows, with `reasons[role]`."""
    if role in reader.vocab:
        column = pc.if_else(pc.equal(pc.utf8_length(column), 0), None, column)
        wrong = _not_ids(column) & np.asarray(column.is_valid().to_numpy(zero_copy_only=False))
        reasons[role] = (wrong, _why(column, wrong) if wrong.any() else NOT_AN_ID)
        return own_values(reader.vocab[role].encode(column), items), wrong
    null = np.asarray(column.is_null().to_numpy(zero_copy_only=False))
    values, huge = int64_values(column)
    reasons[role] = (huge, "does not fit a 64-bit integer") if huge.any() else (values < 0, "is negative")
    return own_values(np.where(null, -1, values), items), (values < 0) | huge


def parse_row_group(reader, group: int, first_row: int) -> None:
    """One row group of a Parquet log into `reader` (`dare_tf.data.logs.blocks.BlockParser`):
    its kept rows' int64 columns appended to `reader.parts`, its bad rows named or
    counted as a CSV block's bad lines are."""
    import pyarrow.parquet as pq

    table = pq.ParquetFile(reader.path).read_row_group(group, columns=sorted(set(reader.roles.values())))
    reader.rows += table.num_rows
    columns = {}
    for role, column in reader.roles.items():
        columns[role] = table.column(column).combine_chunks()
    bad = np.zeros(table.num_rows, bool)
    reasons = {}
    for role, array in columns.items():
        if role.startswith(FIELD_ROLE):  # (null: the item's own value)
            continue
        null = np.asarray(array.is_null().to_numpy(zero_copy_only=False))
        reasons.setdefault(role, (null, "is null"))
        bad |= null
    ints = {}
    for role in reader.int_roles:
        ints[role], wrong = _role_values(reader, role, columns[role], reasons)
        bad |= wrong
    for role in reader.field_roles:
        ints[role], wrong = _field_values(reader, role, columns[role], ints["item"], reasons)
        bad |= wrong
    keep = ~bad
    if "action" in columns:
        action = columns["action"].cast(pa.string()).to_pylist()
        if reader.action_role is not None:
            ints[reader.action_role] = np.array([reader.fmt.actions.index(a) + 1 if a in reader.fmt.actions else 0
                                               for a in action], np.int64)
        else:
            keep &= np.array([a == reader.fmt.click for a in action], bool)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        role = next(r for r, (mask, _) in reasons.items() if mask[row])
        value = columns[role][row].as_py()
        where = f"{reader.path}: row {first_row + row}"
        problem = f"{role} (column {reader.roles[role]!r}) {reasons[role][1]}"
        reader._bad(where, problem, str(value))
        reader.count_bad(where, problem, int(bad.sum()) - 1)
    reader.add({r: v[keep] for r, v in ints.items()})
