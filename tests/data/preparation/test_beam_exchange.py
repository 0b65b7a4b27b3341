"""The Beam driver's work files (`dare_tf.data.preparation.beam_exchange`): user
buckets, protocol order within a bucket, narrowed columns, whole-or-nothing writes,
statistics read once per process."""

import os
import pickle

import numpy as np
import pytest

from dare_tf.data.preparation.beam_exchange import (by_bucket, compact, forget_shared, get, get_bucket, hash_buckets,
                                                    put, put_rows, shared, sorted_bucket, widen)


def _rows(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    return {"key": np.arange(n, dtype=np.int64) + (np.int64(3) << 32), "user": rng.integers(0, 300, n) * 7919,
            "item": rng.integers(0, 50, n), "category": rng.integers(0, 5, n),
            "time": rng.integers(0, 20, n) + 1_500_000_000, "label": rng.integers(0, 2, n),
            "fields": rng.integers(-10, 10, (n, 2))}


def test_every_users_rows_land_in_one_bucket_and_buckets_are_even():
    rows = _rows()
    parts = dict(by_bucket(rows, 4))
    assert sorted(parts) == [0, 1, 2, 3]
    owner = {}
    for j, part in parts.items():
        for u in part["user"].tolist():
            assert owner.setdefault(u, j) == j
    assert sum(len(p["key"]) for p in parts.values()) == len(rows["key"])
    assert np.array_equal(np.sort(np.concatenate([p["key"] for p in parts.values()])), rows["key"])
    # consecutive ids spread over the buckets
    counts = np.bincount(hash_buckets(np.arange(10_000), 4), minlength=4)
    assert counts.min() > 2300 and counts.max() < 2700, counts
    # the same buckets in every worker process and release (pinned), negative ids (fields' own values) included
    assert hash_buckets(np.array([0, 1, 2, 3, 4, 5, 6, 7, 10**12, -5]), 4).tolist() == [0, 0, 1, 2, 2, 3, 0, 1, 0, 0]


@pytest.mark.parametrize("by_time", [False, True])
def test_a_sorted_bucket_holds_each_user_in_protocol_order(by_time):
    rows = _rows()
    parts = [{k: v[lo:lo + 700] for k, v in rows.items()} for lo in (1400, 0, 700)]  # (blocks in any order)
    out, starts = sorted_bucket(parts, by_time)
    assert np.array_equal(np.sort(out["key"]), rows["key"])
    users = out["user"][starts]
    assert list(users) == sorted(set(rows["user"].tolist()))
    for u, lo, hi in zip(users, starts, [*starts[1:], len(out["key"])]):
        mine = np.flatnonzero(rows["user"] == u)  # brute force: the user's rows in file order
        if by_time:
            mine = np.array(sorted(mine, key=lambda i: (rows["time"][i], rows["key"][i])))
        assert np.array_equal(out["key"][lo:hi], rows["key"][mine])
        assert np.array_equal(out["fields"][lo:hi], rows["fields"][mine])


def test_columns_are_stored_narrow_and_read_back_whole(tmp_path):
    rows = {"a": np.array([0, 100], np.int64), "b": np.array([-200, 5]), "c": np.array([0, 1 << 20]),
            "d": np.array([0, 1 << 40]), "e": np.zeros(0, np.int64), "f": np.array([[1, -3], [4, 2]])}
    narrow = compact(rows)
    assert [narrow[k].dtype for k in "abcdef"] == [np.int8, np.int16, np.int32, np.int64, np.int8, np.int8]
    back = widen(narrow)
    assert all(back[k].dtype == np.int64 and np.array_equal(back[k], rows[k]) for k in rows)
    path = put_rows(str(tmp_path / "bucket"), {**rows, "starts": np.array([0, 1])})
    read, starts = get_bucket(path)
    assert list(starts) == [0, 1] and all(np.array_equal(read[k], rows[k]) for k in rows)


def test_a_failed_write_leaves_neither_the_file_nor_a_partial_one(tmp_path):
    path = str(tmp_path / "stats")
    put(path, {"x": 1})
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        put(path, {"x": lambda: 2})  # (a lambda cannot be pickled)
    assert get(path) == {"x": 1}
    assert os.listdir(tmp_path) == ["stats"]


def test_shared_reads_a_file_once_until_it_changes_or_is_forgotten(tmp_path, monkeypatch):
    from dare_tf.data.preparation import beam_exchange

    forget_shared()
    path = put(str(tmp_path / "stats"), {"x": 1})
    calls = []
    real = beam_exchange.get
    monkeypatch.setattr(beam_exchange, "get", lambda p: calls.append(p) or real(p))
    assert shared(path) == {"x": 1} and shared(path) == {"x": 1} and len(calls) == 1
    put(path, {"x": 22})
    os.utime(path, ns=(1, 1))  # (another stamp, whatever the clock's resolution)
    assert shared(path) == {"x": 22} and len(calls) == 2
    forget_shared()
    assert shared(path) == {"x": 22} and len(calls) == 3
