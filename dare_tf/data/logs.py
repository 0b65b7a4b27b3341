"""Raw click and impression logs: which column holds what (`LogFormat`, with the
`taobao` and `tmall` presets) and the arrays a log is read into (`Clicks`).
`dare_tf.data.log_reader` reads the files.
"""

from __future__ import annotations

import dataclasses

import numpy as np

FILE_FORMATS = {"csv": ",", "tsv": "\t", "parquet": None}
ROLES = ("user", "item", "category", "time", "action", "label")
REQUIRED_ROLES = ("user", "item", "time")
INT_ROLES = ("user", "item", "category", "time", "label")
INT64_MAX = 2**63 - 1


class BadLineError(ValueError):
    """A malformed line (or Parquet row) in a raw log: names the file, the line and the content."""


class LogFormatError(ValueError):
    """The log's columns do not match its format (`--columns`, header, Parquet types)."""


@dataclasses.dataclass(frozen=True)
class LogFormat:
    """How a raw log's rows are read.

    Attributes:
        name: a preset's name, or the file format of a custom log.
        file_format: `csv`, `tsv` or `parquet`.
        columns: `(role, column)` pairs; roles are `user`, `item`, `time`
            (required), `category`, `action`, `label`. A column is a name
            (from the header, or Parquet's schema) or, in a CSV/TSV file
            without header, a 0-based index. Without `category` every item
            gets one category; with `action`, only rows whose action is
            `click` are read; with `label` (0/1), the log is an impression log.
        header: CSV/TSV: the first line names the columns.
        click: the action value that is a click (with an `action` column).
        actions: every allowed action value (None: any).
        expected_header: a preset's exact header line.
        sort_by_time: order each user's rows stably by time (Taobao's
            reference keeps the file order).
    """

    name: str
    file_format: str
    columns: tuple[tuple[str, str], ...]
    header: bool = False
    click: str | None = None
    actions: tuple[str, ...] | None = None
    expected_header: str | None = None
    sort_by_time: bool = True

    def __post_init__(self):
        if self.file_format not in FILE_FORMATS:
            raise LogFormatError(f"--format={self.file_format}: expected one of {sorted(FILE_FORMATS)}")
        roles = [r for r, _ in self.columns]
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise LogFormatError(f"--columns: unknown role(s) {unknown}; roles are {list(ROLES)}")
        if len(set(roles)) != len(roles):
            raise LogFormatError(f"--columns: a role is named twice: {roles}")
        missing = [r for r in REQUIRED_ROLES if r not in roles]
        if missing:
            raise LogFormatError(f"--columns: missing {', '.join(f'{r}=COL' for r in missing)} "
                                 f"(required: {', '.join(REQUIRED_ROLES)})")
        if "action" in roles and self.click is None:
            raise LogFormatError("--columns names an action column: --click=VALUE says which value is a click")
        if "action" not in roles and self.click is not None:
            raise LogFormatError("--click needs an action column (--columns=...,action=COL)")
        if "action" in roles and "label" in roles:
            raise LogFormatError("--columns: action and label cannot be combined (a label makes an impression "
                                 "log; an action selects the clicks of a click log)")
        if self.file_format == "parquet" and self.header:
            raise LogFormatError("--header is for CSV and TSV files (Parquet names its columns)")

    @property
    def role_columns(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def impressions(self) -> bool:
        return "label" in self.role_columns

    def to_json(self) -> dict:
        """The format as spec.json records it (lists, not tuples)."""
        import json

        return json.loads(json.dumps(dataclasses.asdict(self)))


def parse_columns(text: str) -> tuple[tuple[str, str], ...]:
    """`user=COL,item=COL,...` -> `(role, column)` pairs (the `--columns` flag)."""
    pairs = []
    for part in text.split(","):
        role, sep, column = part.strip().partition("=")
        if not sep or not role or not column:
            raise LogFormatError(f"--columns={text}: expected ROLE=COLUMN pairs separated by commas, got {part!r}")
        pairs.append((role.strip(), column.strip()))
    return tuple(pairs)


TAOBAO = LogFormat(name="taobao", file_format="csv", columns=(
    ("user", "0"), ("item", "1"), ("category", "2"), ("action", "3"), ("time", "4")),
    click="pv", actions=("pv", "buy", "cart", "fav"), sort_by_time=False)


TMALL = LogFormat(name="tmall", file_format="csv", columns=(
    ("user", "user_id"), ("item", "item_id"), ("category", "cat_id"), ("time", "time_stamp"),
    ("action", "action_type")), header=True, click="0", actions=("0", "1", "2", "3"),
    expected_header="user_id,item_id,cat_id,seller_id,brand_id,time_stamp,action_type")


FORMATS = {f.name: f for f in (TAOBAO, TMALL)}


def log_format_of(dataset: str | None, file_format: str | None, columns: str | None, click: str | None = None,
                  header: bool = False) -> LogFormat:
    """The format the programs' flags name (`data.prepare`, `serving.histories
    append`): a preset (`--dataset`), or `--format` with `--columns` (and
    `--click`, `--header`); `LogFormatError` in one line otherwise."""
    custom = [f"--{n}" for n, v in (("format", file_format), ("columns", columns), ("click", click)) if v is not None]
    custom += ["--header"] if header else []
    if dataset is not None:
        if dataset not in FORMATS:
            raise LogFormatError(f"--dataset={dataset}: expected one of {sorted(FORMATS)}")
        if custom:
            raise LogFormatError(f"--dataset={dataset} is a preset: it cannot be combined with {', '.join(custom)}")
        return FORMATS[dataset]
    if file_format is None or columns is None:
        raise LogFormatError("name the log's format: --dataset=taobao|tmall, or --format=csv|tsv|parquet with "
                             "--columns=user=COL,item=COL,time=COL[,category=COL][,action=COL --click=VALUE]"
                             "[,label=COL]")
    return LogFormat(name=file_format, file_format=file_format, columns=parse_columns(columns), header=header,
                     click=click)


@dataclasses.dataclass
class Clicks:
    """Rows of a log in file order (raw ids): clicks, or with `label`, impressions."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    time: np.ndarray
    rows: int  # data rows read (header excluded, bad lines included)
    bad_lines: int
    sha256: str
    label: np.ndarray | None = None


def dense_ids(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense 1-based ids in order of first appearance, and the raw id of each dense id."""
    uniq, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(1, len(uniq) + 1)
    return rank[inverse].reshape(-1), uniq[order]


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
