"""Logs like the paper's at their real size: Taobao's UserBehavior.csv and Tmall's
user_log_format1.csv, generated vectorised (numpy, no per-row Python), a chunk
of users at a time, so memory stays bounded whatever the size.

Program: `python -m data.synthetic --like=taobao|tmall [--fraction=F] [--sample]`.

With `sample`, the counts are those of the small real sample of that log
(`SAMPLES`, ../shared/data), quirks included: Tmall's rows of a user out of
time order and its empty brands. The tests use these logs where the samples
are absent.

At `fraction` 1 a log has exactly its preset's rows, users, items and
categories (Tmall: also sellers and brands) and each action's rows, in the
real file's format, so `data.prepare --dataset=taobao|tmall` reads it as it
reads the real one; a fraction scales every count. The planted structure is
`dare_tf.data.generation.synthetic`'s at its defaults (`SyntheticConfig`): Zipf
popularity of categories and of items within a category, `interests`
favourite categories per user, sessions that stay in their category with
`p_session`, and related category pairs. Click counts per user are
log-normal (the preset's median and spread) clipped to
[1, `MAX_CLICKS`], then scaled to the preset's clicks exactly. Every other
action is an event on a click of the same user, at its time. Each user's
clicks are spread over the log's days (Taobao: 9 days from 2017-11-25;
Tmall: 2015-05-11 to 11-11, written as MMDD). Every catalogue item appears:
an item no click drew replaces a repeated click (its category follows it;
counted in the truth as `coverage_swaps`).

`<output>.truth.json` holds the counts, the parameters, `related_category`
and `generator_auc`, the test AUC of the generator's own probability of each
user's last click against two popularity-drawn negatives it did not click
(on the first chunk's users), as `data.synthetic` reports it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dare_tf.data.generation.like_presets import LIKE, SAMPLES, Like
from dare_tf.data.generation.synthetic import SyntheticConfig, _zipf_probs
from dare_tf.data.generation.truth import claim_output, last_click_auc, truth_path
from dare_tf.data.logs.times import DAY

# Users generated (and written) at once: the peak memory (1.5 GB at Taobao's size, 2.3 GB at Tmall's).
CHUNK_USERS = 1 << 16
MAX_CLICKS = 20_000


class _Catalogue:
    """Items by category (Zipf within each), category popularity and relations,
    and the sellers and brands of the items."""

    def __init__(self, like: Like, cfg: SyntheticConfig, rng):
        c = like.categories
        self.cat_p = _zipf_probs(c, cfg.zipf, rng)
        self.cat_cdf = np.cumsum(self.cat_p)
        self.related = np.arange(c) ^ 1  # pairs (0,1), (2,3), ...
        self.related[self.related >= c] = c - 1
        extra = rng.multinomial(like.items - c, self.cat_p)  # every category holds at least one item
        self.counts = 1 + extra
        self.first = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.item_cat = np.repeat(np.arange(c), self.counts)
        # Each item's probability within its category; the global CDF is offset by the
        # category, so one searchsorted draws any category's items.
        rank = np.empty(like.items, np.int64)  # each item's popularity rank in its category, at random
        rank[np.lexsort((rng.random(like.items), self.item_cat))] = np.arange(like.items) - self.first[self.item_cat]
        weights = 1.0 / (rank + 1.0) ** cfg.zipf
        totals = np.add.reduceat(weights, self.first)
        self.item_p = weights / totals[self.item_cat]
        within = np.cumsum(self.item_p) - np.repeat(np.cumsum(self.item_p)[self.first] - self.item_p[self.first],
                                                     self.counts)
        self.cdf = self.item_cat + np.minimum(within, 1.0)
        self.seller = _covering(like.sellers, like.items, rng)
        self.brand = _covering(like.brands, like.items, rng)

    def draw_items(self, cats, rng):
        at = np.searchsorted(self.cdf, cats + rng.random(len(cats)))
        return np.clip(at, self.first[cats], self.first[cats] + self.counts[cats] - 1)


def _covering(values: int, items: int, rng) -> np.ndarray | None:
    """Each item's value among `values`, every value held by at least one item."""
    if not values:
        return None
    out = rng.integers(0, values, items)
    out[rng.permutation(items)[:values]] = np.arange(values)
    return out


def _interests(catalogue: _Catalogue, users: int, k: int, rng) -> np.ndarray:
    """`k` distinct favourite categories per user, by popularity."""
    out = np.searchsorted(catalogue.cat_cdf, rng.random((users, k)))
    out = np.minimum(out, len(catalogue.cat_p) - 1)
    while True:
        ordered = np.sort(out, axis=1)
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        if not repeated.any() or len(catalogue.cat_p) < k:
            return out
        out[repeated] = np.minimum(np.searchsorted(catalogue.cat_cdf, rng.random((int(repeated.sum()), k))),
                                   len(catalogue.cat_p) - 1)


def click_lengths(like: Like, rng) -> np.ndarray:
    """Clicks per user: log-normal, clipped, scaled to the preset's clicks exactly."""
    clicks = like.actions[0][1]
    raw = np.clip(rng.lognormal(np.log(like.length_median), like.length_sigma, like.users), 1, MAX_CLICKS)
    lengths = np.maximum(1, np.floor(raw * clicks / raw.sum())).astype(np.int64)
    short = clicks - int(lengths.sum())
    if short > 0:
        lengths[rng.choice(like.users, short, replace=short > like.users)] += 1
    while short < 0:  # (the users raised to one click: one less from the longest)
        longest = np.argsort(-lengths, kind="stable")[:-short]
        lengths[longest] -= lengths[longest] > 1
        short = clicks - int(lengths.sum())
    return lengths


def _sessions(lengths, interests, catalogue: _Catalogue, cfg: SyntheticConfig, rng) -> np.ndarray:
    """Each user's click categories (user-major, users in order): the session
    chain of `dare_tf.data.generation.synthetic`, one step at a time over the users still
    clicking (longest first, so they are a prefix)."""
    order = np.argsort(-lengths, kind="stable")
    longest, interests = lengths[order], interests[order]
    steps = int(longest[0])
    active = np.searchsorted(-longest, -np.arange(steps), side="left")  # users with more than t clicks
    offsets = np.concatenate([[0], np.cumsum(active)])
    flat = np.empty(int(offsets[-1]), np.int64)
    k = interests.shape[1]
    session = interests[np.arange(len(order)), rng.integers(0, k, len(order))]
    for t in range(steps):
        m = int(active[t])
        stay = rng.random(m) < cfg.p_session
        v = rng.random(m)
        popular = np.minimum(np.searchsorted(catalogue.cat_cdf, rng.random(m)), len(catalogue.cat_p) - 1)
        new = np.where(v < cfg.p_interest, interests[np.arange(m), rng.integers(0, k, m)],
                       np.where(v < cfg.p_interest + cfg.p_related, catalogue.related[session[:m]], popular))
        session[:m] = np.where(stay, session[:m], new)
        flat[offsets[t]:offsets[t + 1]] = session[:m]
    # step-major -> user-major, users back in their order
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    user = np.arange(len(flat)) - np.repeat(offsets[:-1], active)
    step = np.repeat(np.arange(steps), active)
    out = np.empty_like(flat)
    out[start[order[user]] + step] = flat
    return out


def _cover(items, cats, assigned, seen, catalogue: _Catalogue, rng) -> int:
    """Puts this chunk's share of the never-drawn items (`assigned`, not `seen`) on
    repeated clicks (not an item's first in the chunk); returns how many."""
    seen[items] = True
    missing = assigned[~seen[assigned]]
    if not len(missing):
        return 0
    repeated = np.ones(len(items), bool)
    repeated[np.unique(items, return_index=True)[1]] = False  # (each item's first click stays)
    repeats = np.flatnonzero(repeated)
    rows = rng.choice(repeats, min(len(missing), len(repeats)), replace=False)
    missing = missing[:len(rows)]
    items[rows], cats[rows] = missing, catalogue.item_cat[missing]
    seen[missing] = True
    return len(rows)


def _times(like: Like, lengths, rng) -> np.ndarray:
    """Each user's click times: `dare_tf.data.generation.synthetic`'s gaps, spread over the days."""
    gaps = np.where(rng.random(int(lengths.sum())) < 0.1, rng.exponential(7200, int(lengths.sum())),
                    rng.exponential(60, int(lengths.sum())))
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    offsets = np.cumsum(gaps)
    offsets -= np.repeat(offsets[start] - gaps[start], lengths)  # each user's from its first click
    span = np.maximum(np.maximum.reduceat(offsets, start), 1.0)
    seconds = offsets / np.repeat(span, lengths) * ((like.days - 1) * DAY)
    return like.first_day + (seconds + np.repeat(rng.uniform(0, DAY - 1, len(lengths)), lengths)).astype(np.int64)


def _share(total: int, parts: np.ndarray) -> np.ndarray:
    """`total` split in proportion to `parts`, exactly (largest remainders)."""
    exact = total * parts / parts.sum()
    out = np.floor(exact).astype(np.int64)
    out[np.argsort(out - exact, kind="stable")[:total - int(out.sum())]] += 1
    return out


def _mmdd(times, like: Like) -> pa.Array:
    """Tmall's `time_stamp`: the day as a zero-padded MMDD string."""
    days = np.datetime64("1970-01-01") + (times // DAY).astype("timedelta64[D]")
    month_start = days.astype("datetime64[M]")
    mmdd = ((month_start.astype(np.int64) % 12) + 1) * 100 + (days - month_start).astype(np.int64) + 1
    return pc.utf8_lpad(pc.cast(pa.array(mmdd), pa.string()), 4, "0")


def _table(like: Like, catalogue: _Catalogue, users, items, cats, times, action, empty: int, rng) -> pa.Table:
    """A chunk's rows in the real file's columns; `empty` of its brand cells empty (at random rows)."""
    values = pa.array([a for a, _ in like.actions])
    actions = values.take(pa.array(action))
    if like.name == "taobao":
        return pa.table({"user": users + 1, "item": items + 1, "category": cats + 1, "behavior": actions,
                         "timestamp": times})
    no_brand = np.zeros(len(items), bool)
    no_brand[rng.choice(len(items), min(empty, len(items)), replace=False)] = True
    return pa.table({"user_id": users + 1, "item_id": items + 1, "cat_id": cats + 1,
                     "seller_id": catalogue.seller[items] + 1,
                     "brand_id": pa.array(catalogue.brand[items] + 1, mask=no_brand),
                     "time_stamp": _mmdd(times, like), "action_type": actions})


def write_like(name: str, output: str, fraction: float = 1.0, seed: int = 0,
               cfg: SyntheticConfig = SyntheticConfig(), sample: bool = False) -> dict:
    """Writes the log like `LIKE[name]` (`SAMPLES[name]` with `sample`; times
    `fraction`) to `output` (renamed into place when whole) and its truth beside
    it; returns the truth."""
    presets = SAMPLES if sample else LIKE
    if name not in presets:
        raise ValueError(f"like={name!r}: expected one of {sorted(presets)}")
    like = presets[name] if fraction == 1 else presets[name].scaled(fraction)
    began = time.perf_counter()
    rng = np.random.default_rng([seed, 0])
    catalogue = _Catalogue(like, cfg, rng)
    lengths = click_lengths(like, rng)
    firsts = np.arange(0, like.users, CHUNK_USERS)
    chunk_clicks = np.add.reduceat(lengths, firsts).astype(float)
    events = np.stack([_share(n, chunk_clicks) for _, n in like.actions[1:]]) if len(like.actions) > 1 else None
    empties = _share(like.empty_brands, chunk_clicks)
    owner = rng.integers(0, len(firsts), like.items)  # the chunk that puts each never-drawn item on a click
    seen = np.zeros(like.items, bool)
    claim_output(output)
    partial, writer, swaps, auc = output + ".tmp", None, 0, None
    try:
        for index, first in enumerate(firsts):
            chunk = np.random.default_rng([seed, 1, index])
            lens = lengths[first:first + CHUNK_USERS]
            interests = _interests(catalogue, len(lens), cfg.interests, chunk)
            cats = _sessions(lens, interests, catalogue, cfg, chunk)
            items = catalogue.draw_items(cats, chunk)
            swaps += _cover(items, cats, np.flatnonzero(owner == index), seen, catalogue, chunk)
            if auc is None:
                auc = last_click_auc(catalogue, cfg, lens, cats, items, interests, chunk)
            times = _times(like, lens, chunk)
            users = np.repeat(np.arange(first, first + len(lens)), lens)
            counts = events[:, index] if events is not None else np.zeros(0, np.int64)
            rows, action = _with_actions(len(items), counts, chunk)
            if like.shuffled:  # each user's rows in a random order, users still grouped
                order = np.lexsort((chunk.random(len(rows)), users[rows]))
                rows, action = rows[order], action[order]
            table = _table(like, catalogue, users[rows], items[rows], cats[rows], times[rows], action,
                           int(empties[index]), chunk)
            if writer is None:
                sink = open(partial, "wb")
                if like.name == "tmall":  # (the real file's header, unquoted)
                    sink.write((",".join(table.column_names) + "\n").encode())
                writer = pacsv.CSVWriter(sink, table.schema, write_options=pacsv.WriteOptions(
                    include_header=False, quoting_style="none"))
            writer.write_table(table)
        writer.close()
        sink.close()
        os.replace(partial, output)
    except BaseException:
        if writer is not None:
            writer.close()
            sink.close()
        if os.path.exists(partial):
            os.remove(partial)
        raise
    truth = _truth(name + ("_sample" if sample else ""), fraction, seed, cfg, like, catalogue, auc, swaps,
                   round(time.perf_counter() - began, 1))
    with open(truth_path(output), "w") as f:
        json.dump(truth, f, indent=1)
    return truth


def _with_actions(clicks: int, counts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's rows with its other actions: `counts[a - 1]` rows of action `a` on
    clicks drawn at random, each right after its click; returns each row's click
    index and its action (0: the click)."""
    on = rng.choice(clicks, int(counts.sum()), replace=int(counts.sum()) > clicks)
    order = np.argsort(np.concatenate([np.arange(clicks), on]), kind="stable")
    rows = np.concatenate([np.arange(clicks), on])[order]
    action = np.concatenate([np.zeros(clicks, np.int64), np.repeat(np.arange(1, len(counts) + 1), counts)])[order]
    return rows, action


def _truth(name, fraction, seed, cfg, like, catalogue, auc, swaps, seconds) -> dict:
    """The generated log's truth file: what was asked, its counts, and what the generator planted."""
    return {"like": name, "fraction": fraction, "seed": seed, "config": dataclasses.asdict(cfg),
            "counts": {"rows": like.rows, "users": like.users, "items": like.items, "categories": like.categories,
                       **({"sellers": like.sellers, "brands": like.brands} if like.sellers else {}),
                       "actions": dict(like.actions)},
            "lengths": {"median": like.length_median, "sigma": like.length_sigma, "max": MAX_CLICKS},
            "generator_auc": auc, "coverage_swaps": swaps, "rows": like.rows,
            "related_category": [0] + (catalogue.related + 1).tolist(), "seconds": seconds}
