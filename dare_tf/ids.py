"""Raw ids (and times) as a request, a history store or a program receives them,
checked in one place: int64 integers, or string ids (`--string_ids`). A value
that is not one (1.5, True, an int mixed with strings, 2**70) is refused in one
line naming the input, never truncated. Pure numpy: the client and the history
stores import it without TensorFlow.
"""

from __future__ import annotations

import numpy as np

INT64 = np.iinfo(np.int64)


def all_strings(values) -> bool:
    """Whether `values` (any nesting) is non-empty and every value a `str`: string ids."""
    flat = np.ravel(values) if isinstance(values, np.ndarray) else np.ravel(np.asarray(values, object))
    return len(flat) > 0 and all(isinstance(v, (str, np.str_)) for v in flat)


def as_int64(name: str, values, error: type[Exception] = ValueError) -> np.ndarray:
    """`values` as an int64 array of the same shape; `error` (one line naming `name`)
    for a value that is not an integer or does not fit int64."""
    # (a list is read as objects: numpy would make True an int, and 2**70 a float)
    array = values if isinstance(values, np.ndarray) else np.asarray(values, object)
    if array.dtype.kind == "i":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind == "u" and (not array.size or array.max() <= INT64.max):
        return array.astype(np.int64)
    for value in np.ravel(array):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            shown = value.item() if isinstance(value, np.generic) else value
            raise error(f"{name}: expected integers, got {shown!r}")
        if not INT64.min <= int(value) <= INT64.max:
            raise error(f"{name}: {value} does not fit int64")
    return np.array(array.tolist(), np.int64).reshape(array.shape) if array.size else np.zeros(array.shape, np.int64)


def as_ids(name: str, values, error: type[Exception] = ValueError) -> np.ndarray:
    """`values` as int64 ids (`as_int64`), or string ids (every value a `str`) as an
    object array of them; ints mixed with strings are refused."""
    if all_strings(values):
        return np.asarray(values, object)
    array = np.asarray(values, object) if not isinstance(values, np.ndarray) else values
    if array.size == 0:  # (an empty list: int64; an empty object array stays string ids)
        return array if array.dtype == object and isinstance(values, np.ndarray) else np.zeros(array.shape, np.int64)
    return as_int64(name, array, error)
