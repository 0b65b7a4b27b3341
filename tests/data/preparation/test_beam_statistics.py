"""The Beam driver's statistics in numpy (`dare_tf.data.preparation.beam_statistics`)
against brute-force Python over the rows; their output against the in-memory
driver's is `tests/data/preparation/test_prepare.py`'s."""

import numpy as np

from dare_tf.data.preparation.beam_exchange import sorted_bucket
from dare_tf.data.preparation.beam_statistics import (cut, dense_of, entries, merge, protocol_keys, reduce_summary,
                                                      user_summary, user_table)


def _brute(ids, keys, count, carry):
    """{id: (first key, last key, summed count, carry at the last key)} in Python."""
    out = {}
    rows = zip(map(tuple, ids.tolist()), map(tuple, keys.tolist()), count.tolist(), map(tuple, carry.tolist()))
    for i, k, c, x in rows:
        first, last, total, at = out.get(i, (k, k, 0, x))
        out[i] = (min(first, k), max(last, k), total + c, x if k >= last else at)
    return out


def _as_dict(s):
    return {tuple(i): (tuple(f), tuple(t), c, tuple(x)) for i, f, t, c, x in zip(
        s["ids"].tolist(), s["first"].tolist(), s["last"].tolist(), s["count"].tolist(), s["carry"].tolist())}


def test_summaries_reduce_and_merge_as_brute_force_in_any_order():
    rng = np.random.default_rng(3)
    n = 3000
    ids = np.stack([rng.integers(0, 4, n), rng.integers(0, 40, n) * 1_000_003], 1)
    keys = np.stack([rng.integers(0, 50, n), rng.permutation(n)], 1)  # (distinct keys)
    count, carry = rng.integers(0, 2, n), rng.integers(0, 9, (n, 2))
    whole = reduce_summary(entries(ids, keys, count, carry))
    assert _as_dict(whole) == _brute(ids, keys, count, carry)
    assert [tuple(i) for i in whole["ids"].tolist()] == sorted({tuple(i) for i in ids.tolist()})  # (ascending)
    cuts = [0, 700, 701, 2200, n]
    parts = [{"k": reduce_summary(entries(ids[a:b], keys[a:b], count[a:b], carry[a:b]))}
             for a, b in zip(cuts, cuts[1:])]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        merged = merge([parts[i] for i in order])["k"]
        assert _as_dict(merged) == _as_dict(whole)
    assert merge([]) == {}


def test_users_are_numbered_by_their_first_rows():
    users = np.array([50, 7, 50, 9, 7, 3, 9])
    keys = np.array([10, 2, 4, 30, 1, 5, 8])  # file keys
    rows = {"key": keys, "user": users, "time": np.array([5, 1, 0, 2, 9, 3, 4]),
            "label": np.array([1, 1, 0, 1, 1, 1, 0]), "item": users, "category": users,
            "fields": np.zeros((7, 0), np.int64)}
    out, starts = sorted_bucket([rows], by_time=False)
    table = user_table([user_summary(out, starts, chronological=False)])
    # brute force: first appearance in file order: 7 (key 1), 50 (key 4), 3 (key 5), 9 (key 8)
    assert list(table["order"]) == [7, 50, 3, 9]
    assert list(dense_of(table, np.array([9, 3, 50, 7]))) == [4, 3, 2, 1]
    assert list(table["clicks"]) == [0, 2, 1, 1, 1] and list(table["rows"]) == [0, 2, 2, 1, 2]
    # by (time, key): 50 (time 0), 7 (time 1), 9 (time 2), 3 (time 3)
    out, starts = sorted_bucket([rows], by_time=True)
    assert list(user_table([user_summary(out, starts, chronological=True)])["order"]) == [50, 7, 9, 3]
    # a time-sorted log (Tmall) still numbers users by their first file row
    assert list(user_table([user_summary(out, starts, chronological=False)])["order"]) == [7, 50, 3, 9]
    # a time-sorted log's keys: (user's dense id, position in its time order)
    keys = protocol_keys(out, starts, table, sort_by_time=True, chronological=False)
    got = {(int(u), int(t)): tuple(k) for u, t, k in zip(out["user"], out["time"], keys.tolist())}
    assert got == {(3, 3): (3, 0), (7, 1): (1, 0), (7, 9): (1, 1), (9, 2): (4, 0), (9, 4): (4, 1), (50, 0): (2, 0),
                   (50, 5): (2, 1)}


def test_summaries_cut_by_id_merge_cut_by_cut_to_the_whole():
    rng = np.random.default_rng(4)
    n = 2000
    ids = np.stack([rng.integers(0, 3, n), rng.integers(0, 60, n)], 1)
    keys = np.stack([rng.permutation(n), np.zeros(n, np.int64)], 1)
    count, carry = rng.integers(0, 2, n), rng.integers(0, 9, (n, 1))
    buckets = [{"k": reduce_summary(entries(ids[a:b], keys[a:b], count[a:b], carry[a:b]))} for a, b in
               ((0, 900), (900, n))]
    cuts = [cut(b, 3) for b in buckets]
    per_cut = [merge([c[k] for c in cuts]) for k in range(3)]
    seen = [{tuple(i) for i in p["k"]["ids"].tolist()} for p in per_cut]
    assert all(seen) and not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert _as_dict(merge(per_cut)["k"]) == _brute(ids, keys, count, carry)
