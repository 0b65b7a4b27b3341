"""The Apache Beam driver's whole-log statistics (`dare_tf.data.preparation.beam`),
as the in-memory driver computes them from the whole log, from per-bucket
summaries in numpy:

- the users (`user_summary` of each bucket, `user_table` of all): dense ids
  in order of each user's first row, its clicks and rows;
- every distinct item, category and further field value (`row_summaries` of
  each bucket, `cut` by id, each cut's `merge` over the buckets): the first
  and last row that holds it in protocol order, its clicks, and an item's
  category and fields' values at its last row;
- `statistics`: `LogStatistics`, the id maps and every raw id's dense id.

A summary (`Summary`: `ids [n, c]` sorted, `first` and `last` keys `[n, 2]`,
`count [n]`, `carry [n, m]` taken at the last key) reduces the same way from
rows (one entry each) or from other summaries, so buckets merge in any order.
Protocol keys order all rows as the in-memory driver sees them: file order
(Taobao), (user rank, position) in a time-sorted log, or `chronological`
(time, file key), the `--split=time` order.
"""

from __future__ import annotations

import numpy as np

from dare_tf.data.logs.times import DAY
from dare_tf.data.preparation.beam_exchange import hash_buckets, lengths, split_by
from dare_tf.data.preparation.examples import LogStatistics, qualifying_users


def _empty(columns: int = 1, carried: int = 0) -> dict:
    return {"ids": np.zeros((0, columns), np.int64), "first": np.zeros((0, 2), np.int64),
            "last": np.zeros((0, 2), np.int64), "count": np.zeros(0, np.int64),
            "carry": np.zeros((0, carried), np.int64)}


def reduce_summary(s: dict) -> dict:
    """One entry per distinct id row of `s`: the least first key, the greatest
    last key and its `carry`, the counts summed; ids ascending."""
    if len(s["ids"]) == 0:
        return s
    ids = [s["ids"][:, c] for c in reversed(range(s["ids"].shape[1]))]
    by_first = np.lexsort((s["first"][:, 1], s["first"][:, 0], *ids))
    by_last = np.lexsort((s["last"][:, 1], s["last"][:, 0], *ids))
    grouped = s["ids"][by_first]
    starts = np.flatnonzero(np.concatenate([[True], (grouped[1:] != grouped[:-1]).any(1)]))
    ends = np.append(starts[1:], len(grouped)) - 1
    return {"ids": grouped[starts], "first": s["first"][by_first[starts]], "last": s["last"][by_last[ends]],
            "count": np.add.reduceat(s["count"][by_first], starts), "carry": s["carry"][by_last[ends]]}


def merge(summaries) -> dict:
    """The summaries of several buckets (`{kind: Summary}` each) as one."""
    summaries = [s for s in summaries if s]
    if not summaries:
        return {}
    return {kind: reduce_summary({part: np.concatenate([s[kind][part] for s in summaries])
                                  for part in summaries[0][kind]}) for kind in summaries[0]}


def cut(summaries: dict, parts: int) -> list[dict]:
    """`{kind: Summary}` cut into `parts` by id (the last id column's hash), so that
    each part can be merged over every bucket on its own; parts hold distinct ids."""
    rows = {kind: split_by(hash_buckets(s["ids"][:, -1], parts), parts) for kind, s in summaries.items()}
    return [{kind: {part: values[rows[kind][k]] for part, values in s.items()} for kind, s in summaries.items()}
            for k in range(parts)]


def entries(ids: np.ndarray, keys: np.ndarray, count: np.ndarray, carry: np.ndarray) -> dict:
    """A summary of rows (`keys [rows, 2]` their protocol keys), before `reduce_summary`."""
    return {"ids": ids.reshape(len(keys), -1), "first": keys, "last": keys, "count": count, "carry": carry}


def user_summary(rows: dict, starts: np.ndarray, chronological: bool) -> dict:
    """Per user of a sorted bucket (`beam_exchange.sorted_bucket`): raw id, the
    key that orders users (its first file row, or `chronological` its first
    (time, file key)), its clicks and rows."""
    n = lengths(starts, len(rows["user"]))
    firsts = (np.stack([rows["time"][starts], rows["key"][starts]], 1) if chronological else
              np.stack([np.minimum.reduceat(rows["key"], starts) if len(starts) else starts, 0 * starts], 1))
    clicks = np.add.reduceat((rows["label"] == 1).astype(np.int64), starts) if len(starts) else starts
    return {"user": rows["user"][starts], "first": firsts, "clicks": clicks, "rows": n}


def user_table(summaries: list[dict]) -> dict:
    """Every user's dense id (in order of first keys): `raw`/`dense` (ascending
    raw ids and theirs, for `dense_of`), `order` (raw id by dense id - 1), and
    `clicks`, `rows` by dense id (0: padding)."""
    user = np.concatenate([s["user"] for s in summaries] or [np.zeros(0, np.int64)])
    first = np.concatenate([s["first"] for s in summaries] or [np.zeros((0, 2), np.int64)])
    clicks, rows = (np.concatenate([s[k] for s in summaries] or [np.zeros(0, np.int64)]) for k in ("clicks", "rows"))
    dense, order = _by_first(first)
    by_raw = np.argsort(user)
    return {"raw": user[by_raw], "dense": dense[by_raw], "order": user[order],
            "clicks": np.concatenate([[0], clicks[order]]), "rows": np.concatenate([[0], rows[order]])}


def dense_of(table: dict, raw: np.ndarray) -> np.ndarray:
    """The dense ids of raw ids that `table` (`raw` ascending, `dense`) holds."""
    return table["dense"][np.searchsorted(table["raw"], raw)]


def protocol_keys(rows: dict, starts: np.ndarray, users: dict, sort_by_time: bool, chronological: bool):
    """`[rows, 2]` every row's protocol key (see the module docstring)."""
    if chronological:
        return np.stack([rows["time"], rows["key"]], 1)
    if not sort_by_time:
        return np.stack([rows["key"], np.zeros_like(rows["key"])], 1)
    n = lengths(starts, len(rows["user"]))
    position = np.arange(len(rows["user"])) - np.repeat(starts, n)
    return np.stack([dense_of(users, rows["user"]), position], 1)


def row_summaries(rows: dict, keys: np.ndarray) -> dict:
    """`{kind: Summary}` of one bucket's rows: `item` (carrying its category and
    fields' values, counting its clicks), `category`, and `field<j>` per further field."""
    clicked = (rows["label"] == 1).astype(np.int64)
    none = np.zeros((len(keys), 0), np.int64)
    kinds = {"item": entries(rows["item"], keys, clicked, np.concatenate([rows["category"][:, None],
                                                                           rows["fields"]], 1)),
             "category": entries(rows["category"], keys, clicked, none)}
    for j in range(rows["fields"].shape[1]):
        kinds[f"field{j}"] = entries(rows["fields"][:, j], keys, clicked, none)
    return {kind: reduce_summary(s) for kind, s in kinds.items()}


def _by_first(first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids (1-based) in order of first keys (`[n, 2]`), and that order."""
    order = np.lexsort((first[:, 1], first[:, 0]))
    dense = np.empty(len(order), np.int64)
    dense[order] = np.arange(1, len(order) + 1)
    return dense, order


def _table(s: dict) -> dict:
    """A summary's dense ids, in order of first keys (`dense_of`'s table)."""
    dense, order = _by_first(s["first"])
    return {"raw": s["ids"][:, 0], "dense": dense, "order": s["ids"][order, 0]}


def statistics(merged: dict, users: dict, protocol, impressions: bool, field_names=()) -> dict:
    """What the later steps read (`beam_exchange.shared`): `LogStatistics`, the
    tables of every raw id's dense id (`users`, `items`, `categories`,
    `fields`: per further field, in order) and `longest` (the most clicks of a user)."""
    items = merged.get("item") or _empty(1, 1 + len(field_names))
    tables = {"items": _table(items), "categories": _table(merged.get("category") or _empty()),
              "fields": [_table(merged.get(f"field{j}") or _empty()) for j in range(len(field_names))]}
    num_items = len(items["ids"]) + 2
    dense_items = tables["items"]["dense"]
    item_category = np.zeros(num_items, np.int32)
    item_category[dense_items] = dense_of(tables["categories"], items["carry"][:, 0])
    item_fields = {}
    for j, name in enumerate(field_names):
        item_fields[name] = np.zeros(num_items, np.int32)
        item_fields[name][dense_items] = dense_of(tables["fields"][j], items["carry"][:, 1 + j])
    counts = np.zeros(num_items, np.int64)
    counts[dense_items] = items["count"]
    # (`--split=time`: users qualify by their clicks alone, on the day they reach min_clicks)
    qualifying = qualifying_users(users["clicks"], users["rows"] if impressions and protocol.split == "user" else None,
                                  protocol)
    stats = LogStatistics(item_category=item_category, item_cdf=np.cumsum(counts), qualifying=qualifying,
                          num_users=len(users["order"]) + 1, item_fields=item_fields)
    return {"stats": stats, "field_names": list(field_names), "users": users, **tables,
            "longest": int(users["clicks"].max()) if len(users["clicks"]) else 0}


def day_summaries(rows: dict) -> dict:
    """`--split=time`: per (day, raw item) of one bucket's rows, its clicks, and
    its category and fields' values at its last row in time order."""
    keys = np.stack([rows["time"], rows["key"]], 1)
    ids = np.stack([rows["time"] // DAY, rows["item"]], 1)
    return {"days": reduce_summary(entries(ids, keys, (rows["label"] == 1).astype(np.int64),
                                           np.concatenate([rows["category"][:, None], rows["fields"]], 1)))}
