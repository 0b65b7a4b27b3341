"""The Apache Beam driver's whole-log statistics (`dare_tf.data.preparation.beam`): per-user
summaries of every distinct item, category and further field value, merged
into the side input of the chunk stage (`statistics`: `LogStatistics`, the id
maps and the dense id of every raw id), as the in-memory driver computes them
from the whole log."""

from __future__ import annotations

import numpy as np

from dare_tf.data.preparation.examples import LogStatistics, qualifying_users
from dare_tf.data.storage.fields import last_rows


def user_summaries(sequence, ranks: dict, sort_by_time: bool, chronological: bool = False):
    """Per distinct item, category and further field value (`("field", j)`) of
    one user: `(first protocol key, last protocol key, category at the last,
    clicks, fields' values at the last)`. Protocol keys order all rows as the
    in-memory driver sees them: file order (Taobao), user rank then position
    (a time-sorted log), or `chronological` (time, file key)."""
    user, _, items, categories, file_keys, times, labels, fields = sequence
    if chronological:
        keys = list(zip(times.tolist(), file_keys.tolist()))
    elif sort_by_time:
        keys = (np.int64(ranks[user]) << 32) + np.arange(len(items), dtype=np.int64)
    else:
        keys = file_keys
    clicked = labels == 1
    kinds = [("item", items), ("category", categories), *((("field", j), fields[:, j]) for j in
                                                          range(fields.shape[1]))]
    for kind, ids in kinds:
        uniq, firsts = np.unique(ids, return_index=True)
        last = last_rows(ids)
        counts = np.bincount(np.searchsorted(uniq, ids[clicked]), minlength=len(uniq))
        for i, f, lst, c in zip(uniq, firsts, last, counts):
            at_last = kind == "item"
            yield (kind, int(i)), (_key(keys[f]), _key(keys[lst]), int(categories[lst]) if at_last else 0,
                                   int(c), tuple(fields[lst].tolist()) if at_last else ())


def _key(key):
    return tuple(key) if isinstance(key, tuple) else int(key)


def merge_summaries(values):
    values = list(values)
    first = min(v[0] for v in values)
    last = max(values, key=lambda v: v[1])
    return first, last[1], last[2], sum(v[3] for v in values), last[4]


def user_ranks(users: dict) -> dict:
    """Raw user -> rank (dense id - 1), in order of first appearance, from
    `{raw user: (first file key, clicks, rows)}`."""
    return {u: r for r, u in enumerate(sorted(users, key=lambda u: users[u][0]))}


def statistics(users, ranks, summaries, protocol, impressions: bool, field_names=()) -> dict:
    """The side input of the chunk stage: `LogStatistics`, the id maps and the
    dense id of every raw id (`field_dense`: per further field, in order)."""
    raw_users = sorted(ranks, key=ranks.get)
    items = sorted(((v[0], k[1], v) for k, v in summaries if k[0] == "item"))
    categories = sorted(((v[0], k[1]) for k, v in summaries if k[0] == "category"))
    values = [sorted((v[0], k[1]) for k, v in summaries if k[0] == ("field", j)) for j in range(len(field_names))]
    item_dense = {raw: i + 1 for i, (_, raw, _) in enumerate(items)}
    category_dense = {raw: i + 1 for i, (_, raw) in enumerate(categories)}
    field_dense = [{raw: i + 1 for i, (_, raw) in enumerate(v)} for v in values]
    num_items = len(items) + 2
    item_category = np.zeros(num_items, np.int32)
    item_fields = {n: np.zeros(num_items, np.int32) for n in field_names}
    counts = np.zeros(num_items, np.int64)
    for _, raw, (_, _, category, count, at_last) in items:
        item_category[item_dense[raw]] = category_dense[category]
        counts[item_dense[raw]] = count
        for j, name in enumerate(field_names):
            item_fields[name][item_dense[raw]] = field_dense[j][at_last[j]]
    clicks = np.array([0] + [users[u][1] for u in raw_users], np.int64)
    rows = np.array([0] + [users[u][2] for u in raw_users], np.int64)
    # (`--split=time`: users qualify by their clicks alone, on the day they reach min_clicks)
    qualifying = qualifying_users(clicks, rows if impressions and protocol.split == "user" else None, protocol)
    return {"stats": LogStatistics(item_category=item_category, item_cdf=np.cumsum(counts), qualifying=qualifying,
                                   num_users=len(raw_users) + 1, item_fields=item_fields),
            "field_names": list(field_names), "field_dense": field_dense,
            "raw_fields": {n: [raw for _, raw in values[j]] for j, n in enumerate(field_names)},
            "raw_items": [raw for _, raw, _ in items], "raw_categories": [raw for _, raw in categories],
            "raw_users": raw_users, "item_dense": item_dense, "category_dense": category_dense,
            "user_dense": {u: r + 1 for u, r in ranks.items()},
            "index": {int(u): i for i, u in enumerate(qualifying)}, "longest": int(clicks.max())}
