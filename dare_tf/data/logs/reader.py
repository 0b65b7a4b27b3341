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
import os
import time

from absl import logging

from dare_tf.data.logs.blocks import BlockParser
from dare_tf.data.logs.clicks import Clicks, in_time_order, time_sorted
from dare_tf.data.logs.formats import (FILE_FORMATS, LogFormat, LogFormatError, check_fields,
                                      resolved_columns)
from dare_tf.data.logs.parquet import parquet_plan
from dare_tf.data.logs.times import EARLIEST, utc_time

BLOCK_BYTES = 64 << 20  # bytes of a CSV/TSV block parsed at once (a Beam work item)


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """A log cut into blocks: CSV/TSV `(offset, size, first line number)` cut at
    line ends, Parquet `(row group, rows, first row number)`; the column names
    (`names`) and the file's sha256."""

    sha256: str
    blocks: list[tuple[int, int, int]]
    names: tuple[str, ...]


# UTF-8's byte-order mark, which spreadsheet programs write before a CSV's first line.
_BOM = b"\xef\xbb\xbf"


# The first bytes of files that are not CSV/TSV text, and what to do instead.
_BINARY = {b"\x1f\x8b": "a gzip file: decompress it first (gunzip)",
           b"PAR1": "a Parquet file: pass --format=parquet",
           b"PK\x03\x04": "a zip archive: extract the log first",
           b"BZh": "a bzip2 file: decompress it first (bunzip2)"}


def check_text(path: str, fmt: LogFormat) -> None:
    """Refuses, in one line, a binary file given as a CSV/TSV log (`fmt`)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    for magic, what in _BINARY.items():
        if head.startswith(magic):
            raise LogFormatError(f"{path}: --format={fmt.file_format} reads text, but this is {what}")
    if b"\x00" in head:
        raise LogFormatError(f"{path}: --format={fmt.file_format} reads text, but this file holds NUL bytes "
                             "(a binary file?)")


def content_end(path: str, window: int = 1 << 16) -> int:
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
    parser = BlockParser(path, fmt, names, skip_bad_lines)
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
    parser = BlockParser(path, fmt, plan.names, skip_bad_lines)
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


# `--max_bad_share`: the share of a log's lines `--skip_bad_lines` may skip before it refuses the log.
MAX_BAD_SHARE = 0.01


def merge_bad_reasons(parts) -> dict[str, list]:
    """`Clicks.bad_reasons` of several blocks as one (counts added, the first example kept)."""
    out: dict[str, list] = {}
    for part in parts:
        for kind, (lines, example) in (part or {}).items():
            out.setdefault(kind, [0, example])[0] += lines
    return out


def check_bad_share(path: str, rows: int, bad_lines: int, reasons: dict, max_bad_share: float = MAX_BAD_SHARE) -> None:
    """Refuses, in one line, a log of which `--skip_bad_lines` skipped more than
    `max_bad_share` of the lines (a wrong column, not a few bad lines), naming the
    count, the share and the most common problem; else warns how many it skipped."""
    if not 0 <= max_bad_share <= 1:  # (nan too)
        raise ValueError(f"max_bad_share={max_bad_share}: must be a number from 0 to 1")
    if not bad_lines:
        return
    share = bad_lines / max(rows, 1)
    lines, example = max(reasons.values(), key=lambda r: r[0]) if reasons else (bad_lines, "?")
    if share > max_bad_share:
        raise ValueError(f"{path}: --skip_bad_lines skipped {bad_lines:,} of {rows:,} lines ({100 * share:.1f}%), "
                         f"more than --max_bad_share={max_bad_share:g}; the most common problem ({lines:,} lines) "
                         f"is {example}: fix that column (--columns, --string_ids, --time_format) rather than skip it")
    logging.warning("%s: skipped %d bad line(s) (%.2f%%; the most common: %d lines, %s)", path, bad_lines,
                    100 * share, lines, example)


def read_log(input_path: str, fmt: LogFormat, skip_bad_lines: bool = False, chronological: bool = False,
             max_bad_share: float = MAX_BAD_SHARE) -> Clicks:
    """The kept rows of a raw log in the protocol's order (sorted by time per user
    unless the format keeps the file order), or all rows in time order;
    `check_bad_share` of what `skip_bad_lines` skipped."""
    start = time.perf_counter()
    clicks = read_clicks(input_path, fmt, skip_bad_lines=skip_bad_lines)
    check_fields(input_path, fmt, [n for n, v in clicks.fields.items() if len(v) and v.max() < 0])
    check_bad_share(input_path, clicks.rows, clicks.bad_lines, clicks.bad_reasons, max_bad_share)
    if len(clicks.user) == 0:
        raise ValueError(f"{input_path}: no {'impression' if fmt.impressions else 'click'} rows"
                         f"{f' (action == {fmt.click!r})' if fmt.click is not None else ''} in {clicks.rows} rows")
    logging.info("read %d rows, %d kept in %.1fs", clicks.rows, len(clicks.user), time.perf_counter() - start)
    early = clicks.time < EARLIEST
    if early.any():  # (named, not refused: a log of made-up times counts from 0)
        logging.warning("%s: %d of %d clicks are dated before 1990 (the earliest %s): if that is not so, the time "
                        "column's unit or format is not the log's (--time_unit, --time_format)", input_path,
                        int(early.sum()), len(early), utc_time(int(clicks.time.min())))
    if chronological:
        return in_time_order(clicks)
    return time_sorted(clicks) if fmt.sort_by_time else clicks
