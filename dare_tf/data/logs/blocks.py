"""The parser of a log's blocks (`dare_tf.data.logs.reader` cuts and reads them):
pyarrow's multi-threaded CSV reader where a block parses and validates, Python's
`csv` line by line where it does not, which names the file, line and content of
each bad line (`BadLineError`) or skips and counts it."""

from __future__ import annotations

import csv
import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dare_tf.data.logs.clicks import Clicks, own_values
from dare_tf.data.logs.formats import (ACTION_FIELD, FIELD_ROLE, FILE_FORMATS, INT64_MAX, INT_ROLES, BadLineError,
                                      LogFormat, resolved_columns)
from dare_tf.data.logs.parquet import parse_row_group
from dare_tf.data.logs.string_ids import IdVocabulary, bad_ids, id_problem, not_ids
from dare_tf.data.logs.times import TIME_UNITS, implausible, parse_time, time_column

ID_ROLES = ("user", "item", "category")
# The csv module refuses a field past 131,072 characters (an error, not a bad line); the readers
# take a field of any length and judge it as the fast path does (an id past MAX_ID_CHARS is a bad
# line naming its length). The limit is process-wide: only ever raised here.
csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
# A bad line whose problem at least 90% of the next lines share (at least this many of them)
# is the column's: its message names the fix, not --skip_bad_lines.
SHARED_PROBLEM_LINES = 10
SHOWN_CHARS = 300  # of a bad line, in its message


def bad_kind(problem: str) -> str:
    """A bad line's problem without the values it quotes: the lines of one kind of
    problem share it (`item (column '1') is not an integer ...: 'x8'` and `...: 'y9'`)."""
    import re

    return re.sub(r"(: )?'[^']*'$|: '[^']*'(?=[ :])", "", problem)  # (with the fields: string ids under --string_ids)


class BlockParser:
    """Parses the blocks of one log (`parse`: CSV/TSV bytes, `parse_row_group`: a
    Parquet row group) and keeps their rows (`result`: `Clicks`): pyarrow's CSV
    reader first, then line by line in Python where a block fails, to name or
    skip each bad line; string ids coded through one vocabulary per role."""

    def __init__(self, path: str, fmt: LogFormat, names: tuple[str, ...], skip_bad_lines: bool):
        self.path, self.fmt, self.names, self.skip = path, fmt, names, skip_bad_lines
        self.roles = resolved_columns(fmt, path, names)
        self.delimiter = FILE_FORMATS[fmt.file_format]
        self.bad_lines = 0
        self.bad_reasons: dict[str, list] = {}  # (`skip`: what the skipped lines had, `Clicks.bad_reasons`)
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
        self.add(columns)

    def add(self, part: dict) -> None:
        """Keeps a block's rows; refuses, in one line naming the file and the column, a
        time past the year 2200 (most likely a finer unit than --time_unit says)."""
        times = part.get("time")
        if times is not None and times.size:
            problem = implausible(int(times.max()), self.fmt.time_unit)
            if problem:
                raise ValueError(f"{self.path}: time (column {self.roles['time']!r}): {problem}")
        self.parts.append(part)

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
            ints["time"] = time_column(table.column(self.roles["time"]).combine_chunks(), **self.fmt.time_options)
            if ints["time"] is None:
                return None
        elif "time" in ints:
            ints["time"] = ints["time"] // TIME_UNITS[self.fmt.time_unit]
        if any(a.size and a.min() < 0 for r, a in ints.items() if r != "label"):
            return None
        if "label" in ints and ints["label"].size and not np.isin(ints["label"], (0, 1)).all():
            return None
        for role in self.field_roles:
            column = table.column(self.roles[role])
            if role in self.vocab:  # (an empty cell: the item's own value)
                column = pc.if_else(pc.equal(pc.utf8_length(column), 0), None, column)
                if pc.any(not_ids(column)).as_py():
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
        for role, column in self.roles.items():  # (never decoded with replacement: distinct ids would merge)
            try:
                values[column].encode("utf-8")
            except UnicodeEncodeError:
                return (f"{role} (column {column!r}) is not valid UTF-8: "
                        f"{values[column].encode('utf-8', errors='surrogateescape')!r}"), {}
        ints = {}
        for role in self.int_roles:
            column = self.roles[role]
            if role == "time":
                try:
                    ints[role] = parse_time(values[column], **self.fmt.time_options)
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

    def _bad(self, where: str, problem: str, text: str, following=()) -> None:
        """Raises `BadLineError` for the bad line `text` (or with `skip`, counts it).
        Where most of the `following` lines (raw) share its problem, the message
        names the column's fix, not `--skip_bad_lines`, which would skip the log."""
        if not self.skip:
            cut = f"... ({len(text):,} characters)" if len(text) > SHOWN_CHARS else ""
            text = text[:SHOWN_CHARS]
            try:
                shown = repr(text.encode("utf-8").decode()) + cut
            except UnicodeEncodeError:  # (bytes that are not UTF-8: shown as bytes)
                shown = repr(text.encode("utf-8", errors="surrogateescape")) + cut
            kind = bad_kind(problem)
            same = sum(1 for raw in following if (other := self._line(raw)[0]) is not None and bad_kind(other) == kind)
            hint = "use --skip_bad_lines to skip and count such lines"
            if len(following) >= SHARED_PROBLEM_LINES and same >= 0.9 * len(following):
                hint = (f"so are {same} of the next {len(following)} lines: the column is read wrong, not a few "
                        "lines bad; fix --columns, --string_ids or --time_format")
            raise BadLineError(f"{where}: {problem}: {shown} ({hint})")
        self.count_bad(where, problem, 1)

    def count_bad(self, where: str, problem: str, lines: int) -> None:
        """Counts `lines` skipped lines of `problem` (the first at `where`)."""
        self.bad_lines += lines
        entry = self.bad_reasons.setdefault(bad_kind(problem), [0, f"{where}: {problem}"])
        entry[0] += lines

    def _line(self, raw: bytes) -> tuple[str | None, dict, str]:
        """One line's problem (None: none), its values by role, and its text."""
        # (bytes that are not UTF-8 kept as surrogates: `_problem` names the field that holds them)
        text = raw.decode("utf-8", errors="surrogateescape").rstrip("\r")
        if "\r" in text:  # (the csv module raises on it)
            return "a carriage return inside the line (a file with \\r line ends?)", {}, text
        if text.count('"') % 2:  # (the csv module would read the line up to it as a row)
            return ("a quoted field that does not end on its line (a line break inside quotes: one row is one line "
                    "here; remove the line breaks from quoted fields)"), {}, text
        return (*self._problem(next(csv.reader([text], delimiter=self.delimiter), [])), text)

    def _slow(self, block: bytes, first_line: int):
        rows = []
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        for offset, raw in enumerate(lines):
            problem, ints, text = self._line(raw)
            if problem is not None:
                self._bad(f"{self.path}:{first_line + offset}", problem, text,
                          lines[offset + 1: offset + 1 + SHARED_PROBLEM_LINES * 10])
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
                      bad_reasons=self.bad_reasons,
                      label=column("label") if "label" in self.roles else None,
                      fields={r[len(FIELD_ROLE):]: column(r) for r in self._names if r.startswith(FIELD_ROLE)},
                      click_code=self.fmt.click_code if self.action_role else None,
                      names={(r[len(FIELD_ROLE):] if r.startswith(FIELD_ROLE) else r): v.names()
                             for r, v in self.vocab.items()} if self.fmt.string_ids else None)
