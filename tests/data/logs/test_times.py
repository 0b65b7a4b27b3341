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
