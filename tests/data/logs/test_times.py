"""dare_tf/data/logs/times.py: integers stay Unix seconds; ISO 8601 and strptime formats
against datetime's own arithmetic; what does not parse names what was expected."""

import calendar

import pytest

from dare_tf.data.logs.times import parse_time

NOV_1 = calendar.timegm((2026, 11, 1, 0, 31, 27))


@pytest.mark.parametrize("text, time_format, expected", [
    ("1511544070", None, 1511544070),
    (" -5 ", None, -5),
    ("2026-11-01T00:31:27Z", None, NOV_1),
    ("2026-11-01T00:31:27", None, NOV_1),  # no zone: UTC
    ("2026-11-01 02:31:27+02:00", None, NOV_1),
    ("2026-11-01", None, NOV_1 - 31 * 60 - 27),
    ("01/11/2026 00:31:27", "%d/%m/%Y %H:%M:%S", NOV_1),
])
def test_times_read_as_unix_seconds(text, time_format, expected):
    assert parse_time(text, time_format) == expected


@pytest.mark.parametrize("text, time_format, message", [
    ("yesterday", None, "'yesterday' is not a time: expected Unix seconds (an integer) or an ISO 8601 time such as "
                        "2026-11-01T00:31:27Z"),
    ("2026-13-01", None, "'2026-13-01' is not a time: expected Unix seconds"),
    ("1511544070", "%Y-%m-%d", "'1511544070' is not a time: expected a time in the format '%Y-%m-%d'"),
])
def test_what_is_not_a_time_names_the_expected_forms(text, time_format, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_time(text, time_format)


# Issue 69 (2): a log's unit and zone.
@pytest.mark.parametrize("text, unit, zone, expected", [
    ("1793523600000", "ms", None, 1793523600),
    ("1793523600123456", "us", None, 1793523600),
    ("1793523600123456789", "ns", None, 1793523600),
    ("2026-11-01T09:00:00Z", "ms", None, 1793523600),  # a calendar time is read as it says
    ("2026-11-01 09:00:00", "s", "Europe/Paris", 1793523600 - 3600),  # 09:00 in Paris is 08:00 UTC (winter)
    ("2026-07-01 09:00:00", "s", "Europe/Paris", calendar.timegm((2026, 7, 1, 7, 0, 0))),  # (summer: UTC+2)
    ("2026-11-01 09:00:00+00:00", "s", "Europe/Paris", 1793523600),  # a time that names its zone keeps it
])
def test_units_and_zones_in_both_readers(text, unit, zone, expected):
    import pyarrow as pa

    from dare_tf.data.logs.times import time_column

    assert parse_time(text, None, unit, zone) == expected
    assert time_column(pa.array([text]), None, unit, zone).tolist() == [expected]  # (the fast path, pyarrow's)


def test_a_naive_parquet_timestamp_is_read_in_the_zone():
    import datetime

    import pyarrow as pa

    from dare_tf.data.logs.times import time_column

    naive = pa.array([datetime.datetime(2026, 11, 1, 9, 0)], pa.timestamp("ms"))
    assert time_column(naive).tolist() == [1793523600]
    assert time_column(naive, zone="Europe/Paris").tolist() == [1793523600 - 3600]


def test_a_time_past_2200_names_the_unit_that_reads_it():
    from dare_tf.data.logs.times import implausible, utc_time

    assert implausible(7_258_118_400) is None and implausible(1_511_544_070) is None
    assert implausible(1_772_000_000_000) == ("1772000000000 read as seconds is past the year 2200; as milliseconds "
                                              "it is 2026-02-25 06:13:20 UTC (1772000000): give --time_unit=ms")
    assert implausible(1_772_000_000_000_000).endswith(f"as microseconds it is {utc_time(1_772_000_000)}: give "
                                                       "--time_unit=us")
    assert implausible(10**25) == ("10000000000000000000000000 read as seconds is past the year 2200: not a time in "
                                   "any unit of --time_unit (s, ms, us, ns)")
