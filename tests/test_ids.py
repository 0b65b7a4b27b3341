"""dare_tf.ids: the one check of raw ids that the client and the history stores share."""

import subprocess
import sys

import numpy as np
import pytest

from dare_tf.ids import all_strings, as_ids, as_int64


def test_integers_keep_their_shape_and_values():
    assert as_int64("x", [[1, 2], [3, -4]]).tolist() == [[1, 2], [3, -4]]
    assert as_int64("x", np.array([5], np.uint64)).dtype == np.int64
    assert as_int64("x", [2**63 - 1, -2**63]).tolist() == [2**63 - 1, -2**63]
    assert as_int64("x", np.array([7], object)).tolist() == [7]
    assert as_int64("x", []).shape == (0,) and as_int64("x", []).dtype == np.int64


@pytest.mark.parametrize("values, message", [
    ([1.5], "x: expected integers, got 1.5"),
    ([1, True], "x: expected integers, got True"),
    ([2**63], "x: 9223372036854775808 does not fit int64"),
    ([-2**63 - 1], "x: -9223372036854775809 does not fit int64"),
    (np.array([2**64 - 1], np.uint64), "x: 18446744073709551615 does not fit int64"),
    ([1, "a"], "x: expected integers, got 'a'"),
])
def test_what_is_not_an_int64_is_refused_in_one_line(values, message):
    with pytest.raises(ValueError) as error:
        as_int64("x", values)
    assert str(error.value) == message


def test_the_callers_error_class():
    class StoreRefusal(ValueError):
        pass

    with pytest.raises(StoreRefusal, match="^items: expected integers, got 2.5$"):
        as_int64("items", [2.5], StoreRefusal)


def test_string_ids_stay_strings_and_mixtures_are_refused():
    out = as_ids("hist_items", [["a", "b"]])
    assert out.dtype == object and out.tolist() == [["a", "b"]]
    assert as_ids("x", np.zeros(0, object)).dtype == object  # (no string ids yet: still a string request)
    assert as_ids("x", []).dtype == np.int64
    assert all_strings(["a"]) and not all_strings([]) and not all_strings(["a", 1])
    with pytest.raises(ValueError, match="^x: expected integers, got 'a'$"):
        as_ids("x", np.array([1, "a"], object))


def test_it_loads_neither_tensorflow_nor_keras():
    code = "import sys, dare_tf.ids, dare_tf.serving.encoding, dare_tf.serving.rest; " \
           "print(sorted(m for m in ('tensorflow', 'keras', 'grpc') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]
