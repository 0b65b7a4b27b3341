"""Readers of the raw Taobao and Tmall click logs into numpy click arrays.

The file is read in blocks cut at line ends. Each block is parsed by
pyarrow's multi-threaded CSV reader (the fast path); a block that fails to
parse or validate is parsed again line by line in Python, which knows the
exact line number of each bad line and either raises `BadLineError` naming
file, line and content, or skips and counts it. Only the click columns are
kept, as int64 arrays; no per-row Python objects live beyond one block.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

BLOCK_BYTES = 64 << 20


class BadLineError(ValueError):
    """A malformed line in a raw log: names the file, the line number and the content."""


@dataclasses.dataclass(frozen=True)
class LogFormat:
    name: str
    columns: tuple[str, ...]
    header: str | None
    user: str
    item: str
    category: str
    time: str
    action: str
    actions: tuple[str, ...]  # every allowed value of the action column
    click: str  # the action value that is a click

    def int_columns(self) -> tuple[str, ...]:
        return (self.user, self.item, self.category, self.time)


TAOBAO = LogFormat(
    name="taobao", columns=("user", "item", "category", "behavior", "timestamp"), header=None,
    user="user", item="item", category="category", time="timestamp", action="behavior",
    actions=("pv", "buy", "cart", "fav"), click="pv")
TMALL = LogFormat(
    name="tmall",
    columns=("user_id", "item_id", "cat_id", "seller_id", "brand_id", "time_stamp", "action_type"),
    header="user_id,item_id,cat_id,seller_id,brand_id,time_stamp,action_type",
    user="user_id", item="item_id", category="cat_id", time="time_stamp", action="action_type",
    actions=("0", "1", "2", "3"), click="0")
FORMATS = {f.name: f for f in (TAOBAO, TMALL)}


@dataclasses.dataclass
class Clicks:
    """Click rows of a log in file order (raw ids)."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    time: np.ndarray
    rows: int  # data rows read (header excluded, bad lines included)
    bad_lines: int
    sha256: str


class _BlockParser:
    def __init__(self, path: str, fmt: LogFormat, skip_bad_lines: bool):
        self.path, self.fmt, self.skip = path, fmt, skip_bad_lines
        self.bad_lines = 0
        self.rows = 0
        self.parts: list[tuple[np.ndarray, ...]] = []
        needed = fmt.int_columns() + (fmt.action,)
        self.read_options = pacsv.ReadOptions(column_names=list(fmt.columns), use_threads=True,
                                              block_size=16 << 20)
        self.parse_options = pacsv.ParseOptions(ignore_empty_lines=False)
        self.convert_options = pacsv.ConvertOptions(
            column_types={**{c: pa.int64() for c in fmt.int_columns()},
                          fmt.action: pa.dictionary(pa.int32(), pa.string())},
            include_columns=list(needed), strings_can_be_null=False)

    def parse(self, block: bytes, first_line: int) -> None:
        lines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        self.rows += lines
        columns = self._fast(block, lines)
        if columns is None:
            columns = self._slow(block, first_line)
        self.parts.append(columns)

    def _fast(self, block: bytes, lines: int):
        try:
            table = pacsv.read_csv(io.BytesIO(block), self.read_options, self.parse_options,
                                   self.convert_options)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        if table.num_rows != lines or any(table.column(c).null_count for c in table.column_names):
            return None
        action = table.column(self.fmt.action).combine_chunks()
        values = action.dictionary.to_pylist()
        if not set(values) <= set(self.fmt.actions):
            return None
        ints = [table.column(c).to_numpy() for c in self.fmt.int_columns()]
        if any(a.size and a.min() < 0 for a in ints):
            return None
        click_code = values.index(self.fmt.click) if self.fmt.click in values else -1
        keep = action.indices.to_numpy(zero_copy_only=False) == click_code
        return tuple(a[keep] for a in ints)

    def _slow(self, block: bytes, first_line: int):
        fmt = self.fmt
        index = {c: fmt.columns.index(c) for c in fmt.int_columns() + (fmt.action,)}
        rows = []
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        for offset, raw in enumerate(lines):
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            fields = text.split(",")
            problem = None
            if len(fields) != len(fmt.columns):
                problem = f"expected {len(fmt.columns)} comma-separated fields, got {len(fields)}"
            else:
                try:
                    ints = [int(fields[index[c]]) for c in fmt.int_columns()]
                except ValueError:
                    bad = next(c for c in fmt.int_columns() if not _is_int(fields[index[c]]))
                    problem = f"field {bad!r} is not an integer: {fields[index[bad]]!r}"
                else:
                    action = fields[index[fmt.action]]
                    if action not in fmt.actions:
                        problem = f"unknown {fmt.action} {action!r} (expected one of {list(fmt.actions)})"
                    elif min(ints) < 0:
                        problem = "negative id or time"
            if problem is not None:
                if not self.skip:
                    raise BadLineError(f"{self.path}:{first_line + offset}: {problem}: {text!r} "
                                       "(use --skip_bad_lines to skip and count such lines)")
                self.bad_lines += 1
                continue
            if action == fmt.click:
                rows.append(ints)
        arr = np.array(rows, np.int64).reshape(-1, len(fmt.int_columns()))
        return tuple(arr[:, i] for i in range(arr.shape[1]))

    def result(self, sha256: str) -> Clicks:
        cols = [np.concatenate([p[i] for p in self.parts]) if self.parts else np.zeros(0, np.int64)
                for i in range(4)]
        return Clicks(*cols, rows=self.rows, bad_lines=self.bad_lines, sha256=sha256)


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def _content_end(path: str, window: int = 1 << 16) -> int:
    """The file offset just past its last line that is not blank."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        while end > 0:
            start = max(end - window, 0)
            f.seek(start)
            stripped = f.read(end - start).rstrip(b" \t\r\n")
            if stripped:
                return start + len(stripped) + 1  # keep the line's own end
            end = start
    return 0


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """A log cut into blocks at line ends: `(offset, size, first line number)` per
    block, and the file's sha256."""

    sha256: str
    blocks: list[tuple[int, int, int]]


def plan_blocks(path: str, fmt: LogFormat, block_bytes: int = BLOCK_BYTES) -> BlockPlan:
    """One pass over the file: its sha256 and its blocks of about `block_bytes`
    cut at line ends (the header, checked here, and blank lines at the end are
    in no block). Each block is then parsed on its own (`parse_block`), in
    this process or on a Beam worker.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is empty, or its header is not the format's.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: input log not found")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path}: input log is empty")
    digest = hashlib.sha256()
    limit = _content_end(path)  # blank lines at the end of the file are not rows
    blocks = []
    with open(path, "rb") as f:
        line_no = 1
        if fmt.header is not None:
            first = f.readline()
            digest.update(first)
            if first.decode("utf-8", errors="replace").strip() != fmt.header:
                raise ValueError(f"{path}:1: expected the {fmt.name} header {fmt.header!r}, "
                                 f"got {first[:200]!r}")
            line_no = 2
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
    return BlockPlan(digest.hexdigest(), blocks)


def parse_block(path: str, fmt: LogFormat, block: tuple[int, int, int], skip_bad_lines: bool = False) -> Clicks:
    """The click rows of one block of `plan_blocks` (raw ids, file order)."""
    offset, size, first_line = block
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    parser = _BlockParser(path, fmt, skip_bad_lines)
    parser.parse(data, first_line)
    return parser.result("")


def read_clicks(path: str, fmt: LogFormat, skip_bad_lines: bool = False,
                block_bytes: int = BLOCK_BYTES) -> Clicks:
    """Reads the click rows of a raw log (see the module docstring).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is empty, or its header is not the format's.
        BadLineError: a malformed line, unless `skip_bad_lines`.
    """
    plan = plan_blocks(path, fmt, block_bytes)
    parser = _BlockParser(path, fmt, skip_bad_lines)
    with open(path, "rb") as f:
        for offset, size, first_line in plan.blocks:
            f.seek(offset)
            parser.parse(f.read(size), first_line)
    clicks = parser.result(plan.sha256)
    if clicks.rows == 0:
        raise ValueError(f"{path}: input log has no data rows")
    return clicks
