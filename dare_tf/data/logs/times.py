"""Times as the package holds them: integer Unix seconds (UTC). A time given as
text is either an integer (Unix seconds, as the Taobao and Tmall logs write
them) or a calendar time in ISO 8601 (`2026-11-01T00:31:27Z`,
`2026-11-01 00:31:27+02:00`, `2026-11-01`; without a zone: UTC), or follows
a `strptime` format the user names (`--time_format=%d/%m/%Y %H:%M`)."""

from __future__ import annotations

import datetime

DAY = 86_400  # seconds: a day of Unix time (UTC), as --split=time's windows and --append's days count them
EXPECTED = "Unix seconds (an integer) or an ISO 8601 time such as 2026-11-01T00:31:27Z"


def parse_time(text: str, time_format: str | None = None) -> int:
    """`text` as Unix seconds; `ValueError` naming what was expected if it is
    not a time (`time_format`: a `strptime` format, instead of the integer or
    ISO 8601 the default reads)."""
    value = str(text).strip()
    if time_format is None:
        try:
            return int(value)
        except ValueError:
            pass
    try:
        if time_format is None:
            moment = datetime.datetime.fromisoformat(value)
        else:
            moment = datetime.datetime.strptime(value, time_format)
    except ValueError:
        expected = EXPECTED if time_format is None else f"a time in the format {time_format!r}"
        raise ValueError(f"{value!r} is not a time: expected {expected}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp())


def utc_time(seconds: int) -> str:
    """Unix seconds as a message shows them: `2038-01-19 00:00:00 UTC (2147385600)`."""
    try:
        moment = datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # (past year 9999)
        return str(int(seconds))
    return f"{moment} UTC ({int(seconds)})"


def time_column(array, time_format: str | None = None):
    """A column of times (a pyarrow array of text, timestamps or dates) as int64
    Unix seconds (numpy), or None when a value is not a time (the caller names
    its line). Text: integers, or ISO 8601 (zoned, naive or both), or
    `time_format`; fast in pyarrow, value by value only for a mix of forms."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_timestamp(array.type) or pa.types.is_date(array.type):
        if pa.types.is_date(array.type):
            array = array.cast(pa.timestamp("s"))
        return np.asarray(pc.cast(array, pa.timestamp("s", array.type.tz if pa.types.is_timestamp(array.type)
                                                         else None), safe=False)
                          .cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    if array.null_count:
        return None
    if time_format is not None:
        parsed = pc.strptime(array, format=time_format, unit="s", error_is_null=True)
        return None if parsed.null_count else parsed.cast(pa.int64()).to_numpy(zero_copy_only=False)
    text = pc.utf8_trim_whitespace(array)
    if pc.all(pc.match_substring_regex(text, r"^-?[0-9]+$")).as_py() is not False:
        try:
            return text.cast(pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, OverflowError):
            return None
    for kind in (pa.timestamp("s", "UTC"), pa.timestamp("s")):  # zoned, then naive (UTC)
        try:
            return pc.cast(text, kind).cast(pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    unique = pc.unique(text)  # a mix of forms (or fractions of a second): one by one
    try:
        seconds = np.array([parse_time(v) for v in unique.to_pylist()], np.int64)
    except (ValueError, OverflowError):  # (a value past int64: the caller names its line)
        return None
    return seconds[np.asarray(pc.index_in(text, value_set=unique).to_numpy(zero_copy_only=False), np.int64)]


__all__ = ["DAY", "EXPECTED", "parse_time", "time_column", "utc_time"]
