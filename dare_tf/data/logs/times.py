"""Times as the package holds them: integer Unix seconds (UTC). A time given as
text is either an integer (Unix seconds, as the Taobao and Tmall logs write
them; `--time_unit=ms|us|ns` for a log in milliseconds, microseconds or
nanoseconds) or a calendar time in ISO 8601 (`2026-11-01T00:31:27Z`,
`2026-11-01 00:31:27+02:00`, `2026-11-01`; without a zone: UTC, or the zone
`--time_zone=Area/City` names), or follows a `strptime` format the user names
(`--time_format=%d/%m/%Y %H:%M`).

A time past the year 2200 is refused (`implausible`): in seconds it is most
likely a log in a finer unit, which the message names."""

from __future__ import annotations

import datetime

DAY = 86_400  # seconds: a day of Unix time (UTC), as --split=time's windows and --append's days count them
EXPECTED = "Unix seconds (an integer) or an ISO 8601 time such as 2026-11-01T00:31:27Z"
# `--time_unit`: an integer time's unit, as the number of them in a second.
TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
# The plausible times of a click log, Unix seconds: 1990-01-01 to 2200-01-01 (UTC).
EARLIEST, LATEST = 631_152_000, 7_258_118_400


def implausible(value: int, unit: str = "s") -> str | None:
    """What is wrong with a time of `value` seconds (read from integers in `unit`)
    past the year 2200, and the unit that would make it a plausible time; None if
    it is not past 2200."""
    if value <= LATEST:
        return None
    raw = value * TIME_UNITS[unit]
    said = f"{raw} read as {UNIT_NAMES[unit]} is past the year 2200"
    for other, per_second in TIME_UNITS.items():
        if other != unit and EARLIEST <= raw // per_second <= LATEST:
            return f"{said}; as {UNIT_NAMES[other]} it is {utc_time(raw // per_second)}: give --time_unit={other}"
    return f"{said}: not a time in any unit of --time_unit ({', '.join(TIME_UNITS)})"


def _zone(name: str | None):
    import zoneinfo

    return datetime.timezone.utc if name is None else zoneinfo.ZoneInfo(name)


def check_zone(name: str) -> None:
    """Refuses a `--time_zone` that names no zone, in one line."""
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"--time_zone={name}: not a time zone (an IANA name such as Europe/Paris or "
                         "America/New_York)") from None


def parse_time(text: str, time_format: str | None = None, unit: str = "s", zone: str | None = None) -> int:
    """`text` as Unix seconds; `ValueError` naming what was expected if it is
    not a time (`time_format`: a `strptime` format, instead of the integer or
    ISO 8601 the default reads; `unit`: an integer's unit; `zone`: the zone of a
    calendar time that names none, default UTC)."""
    value = str(text).strip()
    if time_format is None:
        try:
            return int(value) // TIME_UNITS[unit]
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
        moment = moment.replace(tzinfo=_zone(zone))
    return int(moment.timestamp())


def utc_time(seconds: int) -> str:
    """Unix seconds as a message shows them: `2038-01-19 00:00:00 UTC (2147385600)`."""
    try:
        moment = datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # (past year 9999)
        return str(int(seconds))
    return f"{moment} UTC ({int(seconds)})"


def _zoned(naive, zone: str | None):
    """Naive timestamps (pyarrow, seconds) as Unix seconds, read in `zone` (None: UTC);
    a local time a clock change skips or repeats is read as its earliest instant."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if zone is not None:
        naive = pc.assume_timezone(naive, timezone=zone, ambiguous="earliest", nonexistent="earliest")
    return naive.cast(pa.int64())


def time_column(array, time_format: str | None = None, unit: str = "s", zone: str | None = None):
    """A column of times (a pyarrow array of text, timestamps or dates) as int64
    Unix seconds (numpy), or None when a value is not a time (the caller names
    its line). Text: integers (in `unit`), or ISO 8601 (zoned, naive or both; a
    naive time, date or timestamp read in `zone`, default UTC), or `time_format`;
    fast in pyarrow, value by value only for a mix of forms."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_timestamp(array.type) or pa.types.is_date(array.type):
        if pa.types.is_date(array.type):
            array = array.cast(pa.timestamp("s"))
        tz = array.type.tz
        seconds = pc.cast(array, pa.timestamp("s", tz), safe=False)
        return np.asarray((seconds.cast(pa.int64()) if tz else _zoned(seconds, zone)).fill_null(0)
                          .to_numpy(zero_copy_only=False), np.int64)
    if array.null_count:
        return None
    if time_format is not None:
        parsed = pc.strptime(array, format=time_format, unit="s", error_is_null=True)
        return None if parsed.null_count else _zoned(parsed, zone).to_numpy(zero_copy_only=False)
    text = pc.utf8_trim_whitespace(array)
    if pc.all(pc.match_substring_regex(text, r"^-?[0-9]+$")).as_py() is not False:
        try:
            return text.cast(pa.int64()).to_numpy(zero_copy_only=False) // TIME_UNITS[unit]
        except (pa.ArrowInvalid, OverflowError):
            return None
    try:  # zoned
        return pc.cast(text, pa.timestamp("s", "UTC")).cast(pa.int64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    try:  # naive: UTC, or `zone`
        return _zoned(pc.cast(text, pa.timestamp("s")), zone).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    unique = pc.unique(text)  # a mix of forms (or fractions of a second): one by one
    try:
        seconds = np.array([parse_time(v, None, unit, zone) for v in unique.to_pylist()], np.int64)
    except (ValueError, OverflowError):  # (a value past int64: the caller names its line)
        return None
    return seconds[np.asarray(pc.index_in(text, value_set=unique).to_numpy(zero_copy_only=False), np.int64)]


__all__ = ["DAY", "EARLIEST", "EXPECTED", "LATEST", "TIME_UNITS", "check_zone", "implausible", "parse_time",
           "time_column", "utc_time"]
