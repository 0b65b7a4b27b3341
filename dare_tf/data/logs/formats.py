"""Raw click and impression logs: which column holds what (`LogFormat`, with the
`taobao` and `tmall` presets), the arrays a log is read into (`Clicks`) and
their orders (`time_sorted`, `in_time_order`), and the checks of a file before
and after it is read. `dare_tf.data.logs.reader` reads the files.
"""

from __future__ import annotations

import dataclasses

from dare_tf._faces import public
from dare_tf.data.logs.times import TIME_UNITS, check_zone

FILE_FORMATS = {"csv": ",", "tsv": "\t", "parquet": None}
ROLES = ("user", "item", "category", "time", "action", "label")
REQUIRED_ROLES = ("user", "item", "time")
INT_ROLES = ("user", "item", "category", "time", "label")
INT64_MAX = 2**63 - 1
# A further categorical field of every behaviour: the role `field:NAME` (`--columns=...,field:brand=COL`).
FIELD_ROLE = "field:"
# `--action_field`: the action of every row as a history-only field of this name (codes 1.. in `actions` order).
ACTION_FIELD = "action"
# Names a field may not take: the features and store lists the dataset already has.
RESERVED_FIELD_NAMES = ("item", "category", "position", "user", "uid", "items", "categories", "label", "labels",
                        "time", "times", "length", "action", "time_gap")


@public("dare_tf.data")
class BadLineError(ValueError):
    """A malformed line (or Parquet row) in a raw log: names the file, the line and the content."""


class LogFormatError(ValueError):
    """The log's columns do not match its format (`--columns`, header, Parquet types)."""


@public("dare_tf.data")
@dataclasses.dataclass(frozen=True)
class LogFormat:
    """How a raw log's rows are read.

    Attributes:
        name: a preset's name, or the file format of a custom log.
        file_format: `csv`, `tsv` or `parquet`.
        columns: `(role, column)` pairs; roles are `user`, `item`, `time`
            (required), `category`, `action`, `label`, and `field:NAME`, any
            number of further categorical fields of every behaviour (integer
            ids; an empty cell is the item's own value, a brand of its own:
            raw id `-1 - item`). A column is a name
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
        action_field: keep every row, not only the clicks, with its action as
            the history-only field `action` (raw id: its 1-based place in
            `actions`): non-click rows are history, never examples.
        time_format: the time column's `strptime` format (`--time_format`);
            None: integers (Unix seconds) or ISO 8601 calendar times, as
            `dare_tf.data.logs.times.parse_time` reads them.
        time_unit: the unit of integer times (`--time_unit`: `s`, `ms`, `us`,
            `ns`); calendar times are read as they say.
        time_zone: the zone of calendar times that name none (`--time_zone`,
            an IANA name such as `Europe/Paris`); None: UTC.
        string_ids: user, item, category and field ids are strings (SKUs,
            UUIDs, `N12345`, `Pet Supplies`; `--string_ids`): any non-empty
            text without control characters, `007` and `7` two ids; an empty
            field cell is the item's own value. The id maps then hold these
            strings and the exports take them (`dare_tf.data.logs.string_ids`).
    """

    name: str
    file_format: str
    columns: tuple[tuple[str, str], ...]
    header: bool = False
    click: str | None = None
    actions: tuple[str, ...] | None = None
    expected_header: str | None = None
    sort_by_time: bool = True
    action_field: bool = False
    time_format: str | None = None
    string_ids: bool = False
    time_unit: str = "s"
    time_zone: str | None = None

    def __post_init__(self):
        if self.file_format not in FILE_FORMATS:
            raise LogFormatError(f"--format={self.file_format}: expected one of {sorted(FILE_FORMATS)}")
        if self.time_unit not in TIME_UNITS:
            raise LogFormatError(f"--time_unit={self.time_unit}: expected one of {', '.join(TIME_UNITS)}")
        if self.time_unit != "s" and self.time_format is not None:
            raise LogFormatError(f"--time_unit={self.time_unit} scales integer times; --time_format reads calendar "
                                 "times: give one of them")
        if self.time_zone is not None:
            try:
                check_zone(self.time_zone)
            except ValueError as e:
                raise LogFormatError(str(e)) from None
        roles = [r for r, _ in self.columns]
        for name in self.field_columns:
            if not name.isidentifier() or name in RESERVED_FIELD_NAMES or not name.isascii():
                raise LogFormatError(f"--columns: field:{name}: a field's name must be an identifier other than "
                                     f"{', '.join(RESERVED_FIELD_NAMES)}")
        for i, (role, column) in enumerate(self.columns):  # (a field on the category's column too)
            other = next((r for r, c in self.columns[:i] if c == column), None)
            if other is not None:
                kind = "fields" if role.startswith(FIELD_ROLE) and other.startswith(FIELD_ROLE) else "roles"
                raise LogFormatError(f"--columns: {other}={column} and {role}={column}: one column is given to two "
                                     f"{kind}")
        unknown = sorted(set(roles) - set(ROLES) - {r for r in roles if r.startswith(FIELD_ROLE)})
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
        if self.action_field and ("action" not in roles or self.actions is None):
            raise LogFormatError("--action_field keeps every action as a field: it needs an action column and its "
                                 "values: --actions=VALUE,... for a custom log (a preset's are known)")
        if self.actions is not None and (self.click not in self.actions or len(set(self.actions)) < len(self.actions)):
            raise LogFormatError(f"--actions={','.join(self.actions)}: every action value once, --click={self.click} "
                                 "among them")
        if self.file_format == "parquet" and self.header:
            raise LogFormatError("--header is for CSV and TSV files (Parquet names its columns)")

    @property
    def role_columns(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def field_columns(self) -> dict[str, str]:
        """Each further field's name -> its column, in `--columns` order."""
        return {r[len(FIELD_ROLE):]: c for r, c in self.columns if r.startswith(FIELD_ROLE)}

    @property
    def click_code(self) -> int:
        """`--action_field`: the raw id of a click in the `action` field."""
        return self.actions.index(self.click) + 1

    @property
    def impressions(self) -> bool:
        return "label" in self.role_columns

    @classmethod
    def from_json(cls, fields: dict) -> "LogFormat":
        """The format spec.json records (`to_json`'s inverse)."""
        fields = dict(fields, columns=tuple(tuple(c) for c in fields["columns"]))
        if fields.get("actions") is not None:
            fields["actions"] = tuple(fields["actions"])
        return cls(**fields)

    def to_json(self) -> dict:
        """The format as spec.json records it (lists, not tuples)."""
        import json

        out = json.loads(json.dumps(dataclasses.asdict(self)))
        for name in ("action_field", "time_format", "string_ids", "time_zone"):  # (recorded only when set: earlier
            # datasets keep their identity)
            if not out[name]:
                del out[name]
        if out["time_unit"] == "s":
            del out["time_unit"]
        return out

    @property
    def time_options(self) -> dict:
        """How the time column is read (`dare_tf.data.logs.times.time_column`'s options)."""
        return {"time_format": self.time_format, "unit": self.time_unit, "zone": self.time_zone}


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
# The further fields a preset's log carries, read with `--fields=NAME,...` (`data.prepare`).
PRESET_FIELDS = {"tmall": {"seller": "seller_id", "brand": "brand_id"}}


def with_fields(fmt: LogFormat, names) -> LogFormat:
    """A preset's format reading its further fields `names` (`PRESET_FIELDS`)."""
    names = [n.strip() for n in names if n.strip()]
    known = PRESET_FIELDS.get(fmt.name, {})
    for name in names:
        if name not in known:
            raise LogFormatError(f"--fields={','.join(names)}: the {fmt.name} log has no field {name!r}; "
                                 + (f"its fields: {', '.join(known)}" if known else "it has none (a custom log "
                                    "names its fields in --columns=...,field:NAME=COL)"))
    if len(set(names)) != len(names):
        raise LogFormatError(f"--fields={','.join(names)}: a field is named twice")
    return dataclasses.replace(fmt, columns=fmt.columns + tuple((FIELD_ROLE + n, known[n]) for n in names))


def log_format_of(dataset: str | None, file_format: str | None, columns: str | None, click: str | None = None,
                  header: bool = False, fields=(), action_field: bool = False,
                  time_format: str | None = None, string_ids: bool = False, time_unit: str = "s",
                  time_zone: str | None = None, actions=None) -> LogFormat:
    """The format the programs' flags name (`data.prepare`, `serving.histories
    append`): a preset (`--dataset`, with its further `fields`), or `--format`
    with `--columns` (and `--click`, `--header`); `LogFormatError` in one line
    otherwise."""
    custom = [f"--{n}" for n, v in (("format", file_format), ("columns", columns), ("click", click)) if v is not None]
    custom += ["--header"] if header else []
    custom += ["--time_format"] if time_format is not None else []
    custom += ["--time_unit"] if time_unit != "s" else []
    custom += ["--time_zone"] if time_zone is not None else []
    custom += ["--actions"] if actions else []
    custom += ["--string_ids"] if string_ids else []
    if dataset is not None:
        if dataset not in FORMATS:
            raise LogFormatError(f"--dataset={dataset}: expected one of {sorted(FORMATS)}")
        if custom:
            raise LogFormatError(f"--dataset={dataset} is a preset: it cannot be combined with {', '.join(custom)}")
        fmt = with_fields(FORMATS[dataset], fields) if fields else FORMATS[dataset]
        return dataclasses.replace(fmt, action_field=True) if action_field else fmt
    if fields:
        raise LogFormatError("--fields reads a preset's further fields (--dataset=tmall); a custom log names its "
                             "fields in --columns=...,field:NAME=COL")
    if file_format is None or columns is None:
        raise LogFormatError("name the log's format: --dataset=taobao|tmall, or --format=csv|tsv|parquet with "
                             "--columns=user=COL,item=COL,time=COL[,category=COL][,action=COL --click=VALUE]"
                             "[,label=COL]")
    return LogFormat(name=file_format, file_format=file_format, columns=parse_columns(columns), header=header,
                     click=click, action_field=action_field, time_format=time_format, string_ids=string_ids,
                     time_unit=time_unit, time_zone=time_zone, actions=tuple(actions) if actions else None)


def resolved_columns(fmt: LogFormat, path: str, names: tuple[str, ...],
                     first_line: str | None = None) -> dict[str, str]:
    """role -> column name, checked against the file's columns (`first_line`: a
    headerless file's first line, whose fields name them by index)."""
    out = {}
    for role, column in fmt.columns:
        if column not in names:
            if fmt.file_format != "parquet" and not fmt.header:
                line = f" ({first_line[:200]!r})" if first_line is not None else ""
                raise LogFormatError(
                    f"{path}:1: {len(names)} field(s){line}, but --columns={role}={column} reads field {column} "
                    f"(0-based): a malformed line, or a field past the line's (pass --header if it names the "
                    "columns)")
            raise LogFormatError(f"--columns: {role}={column}: {path} has no column {column!r}; its columns are: "
                                 f"{', '.join(names)}")
        fields = [i for i, name in enumerate(names) if name == column]
        if len(fields) > 1:  # (which one is meant is not said: the parsers would each pick one)
            raise LogFormatError(f"--columns: {role}={column}: {path} has {len(fields)} columns named {column!r} "
                                 f"(fields {', '.join(map(str, fields))}, 0-based); rename them, or read the file "
                                 "without --header and name columns by index")
        out[role] = column
    return out


def check_fields(path: str, fmt: LogFormat, empty) -> None:
    """Refuses, in one line, a log to prepare whose field columns `empty` (names)
    are empty in every row kept (a few live clicks without a brand are not)."""
    for name in empty:
        raise LogFormatError(f"{path}: field {name} (column {fmt.field_columns[name]!r}) is empty in every "
                             f"{'impression' if fmt.impressions else 'click'} row; drop it from --columns "
                             "(--fields), or fill the column")
