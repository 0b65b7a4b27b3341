"""Readers of raw click and impression logs (CSV, TSV, Parquet) into numpy arrays.

CSV and TSV files are read in blocks cut at line ends. Each block is parsed
by pyarrow's multi-threaded CSV reader (the fast path); a block that fails to
parse or validate is parsed again line by line in Python, which knows the
exact line number of each bad line and either raises `BadLineError` naming
file, line and content, or skips and counts it. Parquet files are read one
row group at a time; a column of the wrong type is refused up front, and a
bad value is named by its row. Only the needed columns are kept, as int64
arrays; no per-row Python objects live beyond one block. A further field's
empty cell (or null) is the item's own value: raw id `-1 - item`.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from absl import logging

from dare_tf.data.logs.formats import (ACTION_FIELD, FIELD_ROLE, FILE_FORMATS, INT64_MAX, INT_ROLES, BadLineError,
    Clicks, LogFormat, LogFormatError, check_fields, check_text, content_end, in_time_order, own_values,
    resolved_columns, time_sorted)
from dare_tf.data.logs.parquet import parquet_plan, parse_row_group
from dare_tf.data.logs.string_ids import IdVocabulary, bad_ids, id_problem
from dare_tf.data.logs.times import parse_time, time_column

BLOCK_BYTES = 64 << 20  # bytes of a CSV/TSV block parsed at once (a Beam work item)
ID_ROLES = ("user", "item", "category")  # (with the fields: string ids under --string_ids)


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """A log cut into blocks: CSV/TSV `(offset, size, first line number)` cut at
    line ends, Parquet `(row group, rows, first row number)`; the column names
    (`names`) and the file's sha256."""

    sha256: str
    blocks: list[tuple[int, int, int]]
    names: tuple[str, ...]


class _BlockParser:
    def __init__(self, path: str, fmt: LogFormat, names: tuple[str, ...], skip_bad_lines: bool):
        self.path, self.fmt, self.names, self.skip = path, fmt, names, skip_bad_lines
        self.roles = resolved_columns(fmt, path, names)
        self.delimiter = FILE_FORMATS[fmt.file_format]
        self.bad_lines = 0
        self.rows = 0
        self.parts: list[dict[str, np.ndarray]] = []
        self.int_roles = [r for r in INT_ROLES if r in self.roles]
        self.field_roles = [r for r in self.roles if r.startswith(FIELD_ROLE)]
        self.action_role = FIELD_ROLE + ACTION_FIELD if fmt.action_field else None  # (the codes, after the fields)
        self.custom = fmt.name == fmt.file_format  # (not a preset: --string_ids is the custom logs')
        # `--string_ids`: each id role's strings -> codes (`dare_tf.data.logs.string_ids`)
        self.vocab = {r: IdVocabulary() for r in (*ID_ROLES, *self.field_roles)
                      if r in self.roles and fmt.string_ids}
        # Times as text (calendar times, or --time_format): from a format that names one, or from
        # the first block whose times are not all integers on (`dare_tf.data.logs.times`).
        self.time_text = fmt.time_format is not None
        if fmt.file_format != "parquet":
            self.read_options = pacsv.ReadOptions(column_names=list(names), use_threads=True, block_size=16 << 20)
            self.parse_options = pacsv.ParseOptions(delimiter=self.delimiter, ignore_empty_lines=False)

    def _convert_options(self):
        types = {self.roles[r]: pa.string() if r in self.vocab else pa.int64()
                 for r in (*self.int_roles, *self.field_roles)}
        if self.time_text:
            types[self.roles["time"]] = pa.string()
        if "action" in self.roles:
            types[self.roles["action"]] = pa.dictionary(pa.int32(), pa.string())
        return pacsv.ConvertOptions(column_types=types, include_columns=list(types), strings_can_be_null=False)

    # -- CSV / TSV ---------------------------------------------------------------------
    def parse(self, block: bytes, first_line: int) -> None:
        lines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        self.rows += lines
        columns = self._fast(block, lines)
        if columns is None:
            columns = self._slow(block, first_line)
        self.parts.append(columns)

    def _fast(self, block: bytes, lines: int):
        try:
            table = pacsv.read_csv(io.BytesIO(block), self.read_options, self.parse_options, self._convert_options())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if self.time_text:
                return None
            self.time_text = True  # (calendar times? read as text; if the block still fails, the slow path says why)
            columns = self._fast(block, lines)
            self.time_text = columns is not None
            return columns
        fields = {self.roles[r] for r in self.field_roles}  # (may be empty: the item's own value)
        if table.num_rows != lines or any(table.column(c).null_count for c in table.column_names if c not in fields):
            return None
        return self._select(table)

    def _select(self, table: pa.Table):
        """The rows that are kept (clicks, or every impression) as int64 arrays by role;
        None where a value is invalid (the slow path then names it)."""
        ints = {r: table.column(self.roles[r]).to_numpy() for r in self.int_roles
                if (r != "time" or not self.time_text) and r not in self.vocab}
        for role in self.int_roles:
            if role in self.vocab:
                if bad_ids(table.column(self.roles[role])):
                    return None
                ints[role] = self.vocab[role].encode(table.column(self.roles[role]))
        if self.time_text:
            ints["time"] = time_column(table.column(self.roles["time"]).combine_chunks(), self.fmt.time_format)
            if ints["time"] is None:
                return None
        if any(a.size and a.min() < 0 for r, a in ints.items() if r != "label"):
            return None
        if "label" in ints and ints["label"].size and not np.isin(ints["label"], (0, 1)).all():
            return None
        for role in self.field_roles:
            column = table.column(self.roles[role])
            if role in self.vocab:  # (an empty cell: the item's own value)
                column = pc.if_else(pc.equal(pc.utf8_length(column), 0), None, column)
                if pc.any(pc.match_substring_regex(column, r"\s")).as_py():
                    return None
                ints[role] = own_values(self.vocab[role].encode(column), ints["item"])
                continue
            if column.null_count < len(column) and pc.min(column).as_py() < 0:
                return None
            ints[role] = own_values(column.fill_null(-1).to_numpy(), ints["item"])
        if "action" not in self.roles:
            return ints
        action = table.column(self.roles["action"]).combine_chunks()
        if not pa.types.is_dictionary(action.type):
            action = action.cast(pa.string()).dictionary_encode()
        values = action.dictionary.to_pylist()
        if self.fmt.actions is not None and not set(values) <= set(self.fmt.actions):
            return None
        indices = action.indices.to_numpy(zero_copy_only=False)
        if self.action_role is not None:  # every row, with its action's code
            ints[self.action_role] = np.array([self.fmt.actions.index(v) + 1 for v in values], np.int64)[indices]
            return ints
        code = values.index(self.fmt.click) if self.fmt.click in values else -1
        keep = indices == code
        return {r: a[keep] for r, a in ints.items()}

    def _problem(self, fields: list[str]) -> tuple[str | None, dict]:
        if len(fields) != len(self.names):
            sep = "comma" if self.delimiter == "," else "tab"
            got = len(fields) if fields else "an empty line"
            return f"expected {len(self.names)} {sep}-separated fields, got {got}", {}
        values = dict(zip(self.names, fields))
        ints = {}
        for role in self.int_roles:
            column = self.roles[role]
            if role == "time":
                try:
                    ints[role] = parse_time(values[column], self.fmt.time_format)
                except ValueError as e:
                    hint = "" if self.fmt.time_format else " (or name its format: --time_format=...)"
                    return f"time (column {column!r}): {e}{hint}", {}
            elif role in self.vocab:
                problem = id_problem(values[column])
                if problem:
                    return f"{role} (column {column!r}) {problem}", {}
                ints[role] = self.vocab[role].code(values[column])
                continue
            else:
                try:
                    ints[role] = int(values[column])
                except ValueError:
                    hint = " (string ids: --string_ids)" if role in ID_ROLES and self.custom else ""
                    return f"{role} (column {column!r}) is not an integer{hint}: {values[column]!r}", {}
            if not -INT64_MAX - 1 <= ints[role] <= INT64_MAX:
                return f"{role} (column {column!r}) = {values[column]} does not fit a 64-bit integer", {}
            if role == "label" and ints[role] not in (0, 1):
                return f"label (column {column!r}) must be 0 or 1, got {values[column]!r}", {}
            if ints[role] < 0:
                return f"{role} (column {column!r}) is negative: {values[column]!r}", {}
        for role in self.field_roles:
            column, text = self.roles[role], values[self.roles[role]]
            if role in self.vocab:
                problem = id_problem(text) if text else None
                if problem:
                    return f"{role} (column {column!r}) {problem}", {}
                ints[role] = self.vocab[role].code(text) if text else -1 - ints["item"]
                continue
            text = text.strip()
            if text and not (text.isdigit() and int(text) <= INT64_MAX):
                hint = "; string ids: --string_ids" if self.custom else ""
                return f"{role} (column {column!r}) is not an id (an integer >= 0, or empty{hint}): {text!r}", {}
            ints[role] = int(text) if text else -1 - ints["item"]
        if "action" in self.roles:
            action = values[self.roles["action"]]
            if self.fmt.actions is not None and action not in self.fmt.actions:
                return (f"unknown action (column {self.roles['action']!r}) {action!r} "
                        f"(expected one of {list(self.fmt.actions)})"), {}
            ints["action"] = action
            if self.action_role is not None:
                ints[self.action_role] = self.fmt.actions.index(action) + 1
        return None, ints

    @property
    def _names(self) -> tuple[str, ...]:
        """The int64 columns a block yields, in order."""
        return (*self.int_roles, *self.field_roles, *([self.action_role] if self.action_role else []))

    def _bad(self, where: str, problem: str, text: str) -> None:
        if not self.skip:
            raise BadLineError(f"{where}: {problem}: {text!r} (use --skip_bad_lines to skip and count such lines)")
        self.bad_lines += 1

    def _slow(self, block: bytes, first_line: int):
        rows = []
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        for offset, raw in enumerate(lines):
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            if "\r" in text:  # (the csv module raises on it)
                problem, ints = "a carriage return inside the line (a file with \\r line ends?)", {}
            elif text.count('"') % 2:  # (the csv module would read the line up to it as a row)
                problem, ints = ("a quoted field that does not end on its line (a line break inside quotes: one row "
                                 "is one line here; remove the line breaks from quoted fields)"), {}
            else:
                problem, ints = self._problem(next(csv.reader([text], delimiter=self.delimiter), []))
            if problem is not None:
                self._bad(f"{self.path}:{first_line + offset}", problem, text)
            elif ints.pop("action", self.fmt.click) == self.fmt.click or self.action_role is not None:
                rows.append([ints[r] for r in self._names])
        names = self._names
        arr = np.array(rows, np.int64).reshape(-1, len(names))
        return {r: arr[:, i] for i, r in enumerate(names)}

    # -- Parquet -----------------------------------------------------------------------
    def parse_row_group(self, group: int, first_row: int) -> None:
        parse_row_group(self, group, first_row)

    def result(self, sha256: str) -> Clicks:
        def column(role):
            if not self.parts:
                return np.zeros(0, np.int64)
            return np.concatenate([p[role] for p in self.parts])
        user = column("user")
        return Clicks(user=user, item=column("item"),
                      category=column("category") if "category" in self.roles else np.zeros(len(user), np.int64),
                      time=column("time"), rows=self.rows, bad_lines=self.bad_lines, sha256=sha256,
                      label=column("label") if "label" in self.roles else None,
                      fields={r[len(FIELD_ROLE):]: column(r) for r in self._names if r.startswith(FIELD_ROLE)},
                      click_code=self.fmt.click_code if self.action_role else None,
                      names={(r[len(FIELD_ROLE):] if r.startswith(FIELD_ROLE) else r): v.names()
                             for r, v in self.vocab.items()} if self.fmt.string_ids else None)


# UTF-8's byte-order mark, which spreadsheet programs write before a CSV's first line.
_BOM = b"\xef\xbb\xbf"


def plan_blocks(path: str, fmt: LogFormat, block_bytes: int = BLOCK_BYTES) -> BlockPlan:
    """One pass over the file: its sha256, its column names and its blocks of
    about `block_bytes` cut at line ends (the header, checked here, and blank
    lines at the end are in no block); Parquet: its row groups. Each block is
    then parsed on its own (`parse_block`), in this process or on a Beam worker.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is empty, its header is not the format's, or
            `--columns` names a column it lacks (`LogFormatError`).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: input log not found")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path}: input log is empty")
    if fmt.file_format == "parquet":
        return BlockPlan(*parquet_plan(path, fmt))
    delimiter = FILE_FORMATS[fmt.file_format]
    check_text(path, fmt)
    digest = hashlib.sha256()
    limit = content_end(path)  # blank lines at the end of the file are not rows
    blocks = []
    with open(path, "rb") as f:
        line_no = 1
        first = f.readline()
        bom = len(_BOM) if first.startswith(_BOM) else 0  # (a byte-order mark, as spreadsheets write: not a column)
        first_text = first[bom:].decode("utf-8", errors="replace").rstrip("\r\n")
        if "\r" in first_text:
            raise LogFormatError(f"{path}:1: a carriage return (\\r) inside the first line: a file whose lines end "
                                 "in \\r alone (convert them: tr '\\r' '\\n'), or a stray \\r to remove")
        names = tuple(c.strip() for c in next(csv.reader([first_text], delimiter=delimiter), []))
        if fmt.header:
            digest.update(first)
            if fmt.expected_header is not None and first_text.strip() != fmt.expected_header:
                raise ValueError(f"{path}:1: expected the {fmt.name} header {fmt.expected_header!r}, "
                                 f"got {first[:200]!r}")
            line_no = 2
        else:
            names = tuple(str(i) for i in range(len(names)))
            digest.update(first[:bom])
            f.seek(bom)
        block_start = pos = f.tell()
        while True:
            chunk = f.read(max(min(block_bytes, limit - pos), 0))
            digest.update(chunk)
            if not chunk:
                if pos > block_start:
                    blocks.append((block_start, pos - block_start, line_no))
                break
            cut = chunk.rfind(b"\n")
            if cut >= 0:  # the bytes before `chunk` since block_start hold no line end
                end = pos + cut + 1
                blocks.append((block_start, end - block_start, line_no))
                line_no += chunk.count(b"\n", 0, cut + 1)
                block_start = end
            pos += len(chunk)
        digest.update(f.read())  # the blank tail
    resolved_columns(fmt, path, names, None if fmt.header else first_text)
    return BlockPlan(digest.hexdigest(), blocks, names)


def parse_block(path: str, fmt: LogFormat, names: tuple[str, ...], block: tuple[int, int, int],
                skip_bad_lines: bool = False) -> Clicks:
    """The kept rows of one block of `plan_blocks` (raw ids, file order)."""
    parser = _BlockParser(path, fmt, names, skip_bad_lines)
    offset, size, first_line = block
    if fmt.file_format == "parquet":
        parser.parse_row_group(offset, first_line)
    else:
        with open(path, "rb") as f:
            f.seek(offset)
            parser.parse(f.read(size), first_line)
    return parser.result("")


def read_clicks(path: str, fmt: LogFormat, skip_bad_lines: bool = False,
                block_bytes: int = BLOCK_BYTES) -> Clicks:
    """Reads the kept rows of a raw log (see the module docstring).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is empty, its header is not the format's, or its
            columns do not match `fmt`.
        BadLineError: a malformed line, unless `skip_bad_lines`.
    """
    plan = plan_blocks(path, fmt, block_bytes)
    parser = _BlockParser(path, fmt, plan.names, skip_bad_lines)
    if fmt.file_format == "parquet":
        for group, _, first_row in plan.blocks:
            parser.parse_row_group(group, first_row)
    else:
        with open(path, "rb") as f:
            for offset, size, first_line in plan.blocks:
                f.seek(offset)
                parser.parse(f.read(size), first_line)
    clicks = parser.result(plan.sha256)
    if clicks.rows == 0:
        raise ValueError(f"{path}: input log has no data rows")
    return clicks


def read_log(input_path: str, fmt: LogFormat, skip_bad_lines: bool = False, chronological: bool = False) -> Clicks:
    """The kept rows of a raw log in the protocol's order (sorted by time per user
    unless the format keeps the file order), or all rows in time order."""
    start = time.perf_counter()
    clicks = read_clicks(input_path, fmt, skip_bad_lines=skip_bad_lines)
    check_fields(input_path, fmt, [n for n, v in clicks.fields.items() if len(v) and v.max() < 0])
    if clicks.bad_lines:
        logging.warning("%s: skipped %d bad line(s)", input_path, clicks.bad_lines)
    if len(clicks.user) == 0:
        raise ValueError(f"{input_path}: no {'impression' if fmt.impressions else 'click'} rows"
                         f"{f' (action == {fmt.click!r})' if fmt.click is not None else ''} in {clicks.rows} rows")
    logging.info("read %d rows, %d kept in %.1fs", clicks.rows, len(clicks.user), time.perf_counter() - start)
    if chronological:
        return in_time_order(clicks)
    return time_sorted(clicks) if fmt.sort_by_time else clicks
