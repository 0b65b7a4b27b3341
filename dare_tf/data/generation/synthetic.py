"""A Taobao-format click log with planted structure, plus its ground truth.

Program: `python -m data.synthetic` (data/synthetic.py).

Planted structure (all users simulated together, one step at a time):

- popularity skew: categories and, within a category, items follow Zipf laws;
- long-term interests: each user has `interests` favourite categories;
- sessions: a click stays in the session's category with `p_session`;
- related categories: categories come in pairs; a new session picks the
  partner of the previous session's category with `p_related`, one of the
  user's interests with `p_interest`, else a popular category.
- lifelong re-consumption (`p_recall`, off by default): each click from
  position `recall_lag[0]` on is, with probability `p_recall`, the user's
  own click `lag` steps back (`lag` uniform in `recall_lag`; beyond a
  200-slot window at the defaults). With long users this is the
  "lifelong" log of docs/long-histories.md.
- long-range returns (`p_return`, off by default): a new session returns,
  with probability `p_return`, to the category of the user's own click
  `lag` steps back (`lag` uniform in `recall_lag`): the next click's
  category is predictable from far back in the history, not from its
  recent clicks.
- brands (`brands`, off by default): every item belongs to one of `brands`
  brands, across categories; each user favours `brand_interests` of them,
  and each click is, with probability `p_brand`, an item of one of the
  user's brands (its category then follows the item): a latent interest
  that the item's brand carries beyond its category. The log then has a
  sixth column, the brand (`data.prepare --format=csv --columns=user=0,
  item=1,category=2,action=3,time=4,field:brand=5 --click=pv`).
About 10% extra rows are buy/cart/fav events, which preparation drops.
`<output>.truth.json` holds the planted truth (`dare_tf.data.generation.truth`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from dare_tf._faces import public
from dare_tf.data.generation.truth import claim_output, ground_truth, truth_path


@public("dare_tf.data")
@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the planted generator.

    Attributes:
        users: users in the log.
        items: catalogue size.
        categories: categories (in related pairs).
        min_length: fewest clicks of a user.
        max_length: most clicks of a user.
        length_median: median clicks per user. Lengths are log-normal
            (clipped to [min_length, max_length]), so, as in real logs, many
            users have histories shorter than a model's L and some much longer.
        length_sigma: log-normal spread of the lengths (0: every user has
            length_median clicks).
        interests: favourite categories per user.
        p_session: probability that a click stays in the session's category.
        p_interest: probability that a new session is one of the user's interests.
        p_related: probability that a new session is the related category.
        zipf: Zipf exponent of category and item popularity.
        extra_events: share of extra non-click (buy/cart/fav) rows.
        p_recall: probability that a click repeats one of the user's own
            clicks `recall_lag` back (0: none).
        recall_lag: `(min, max)` lag of a repeated click or a returning session.
        p_return: probability that a new session returns to the category of
            the user's own click `recall_lag` back (0: none).
        days: spread each user's clicks over this many UTC days (their gaps
            scaled so that the user's first click falls in the first day and
            the last in the last: every day holds every user's clicks, as a
            log read day by day does; `data.prepare --split=time`); 0: the
            clicks' own gaps (a user's clicks span hours to days).
        brands: brands of the catalogue (0: the log has no brand column).
        brand_interests: favourite brands per user.
        p_brand: probability that a click is an item of one of the user's brands.
        seed: random seed.
    """

    users: int = 2000
    items: int = 20_000
    categories: int = 200
    min_length: int = 20
    max_length: int = 1000
    length_median: int = 120
    length_sigma: float = 0.8
    interests: int = 3
    p_session: float = 0.6
    p_interest: float = 0.5
    p_related: float = 0.2
    zipf: float = 1.1
    extra_events: float = 0.1
    p_recall: float = 0.0
    recall_lag: tuple[int, ...] = (500, 1900)
    p_return: float = 0.0
    days: int = 0
    brands: int = 0
    brand_interests: int = 2
    p_brand: float = 0.3
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "recall_lag", tuple(int(v) for v in self.recall_lag))
        if self.brands < 0 or (self.brands and not 1 <= self.brand_interests <= self.brands):
            raise ValueError(f"brands={self.brands}, brand_interests={self.brand_interests}: need brands >= 0 and, "
                             "with brands, 1 <= brand_interests <= brands")
        for name in ("p_recall", "p_return", "p_brand"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be in [0, 1]")
        if len(self.recall_lag) != 2 or not 1 <= self.recall_lag[0] <= self.recall_lag[1]:
            raise ValueError(f"recall_lag={list(self.recall_lag)}: need two lags 1 <= min <= max")
        if self.days < 0:
            raise ValueError(f"days={self.days}: must be >= 0")


def _zipf_probs(n: int, a: float, rng) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** a
    return rng.permutation(p / p.sum())


class _World:
    """The fixed parts of the generator: catalogue, popularity, relations, interests."""

    def __init__(self, cfg: SyntheticConfig, rng):
        self.cfg = cfg
        c = cfg.categories
        self.cat_p = _zipf_probs(c, cfg.zipf, rng)
        self.related = np.arange(c) ^ 1  # pairs (0,1), (2,3), ...
        self.related[self.related >= c] = c - 1
        # Items: every category gets items in proportion to its popularity (at least 1).
        counts = np.maximum(1, np.round(self.cat_p * (cfg.items - c)).astype(int) + 1)
        self.item_cat = np.repeat(np.arange(c), counts)
        self.cat_items = np.split(np.arange(len(self.item_cat)), np.cumsum(counts)[:-1])
        self.item_p_in_cat = np.concatenate([_zipf_probs(n, cfg.zipf, rng) for n in counts])
        self.cat_cdfs = [np.cumsum(self.item_p_in_cat[ix]) for ix in self.cat_items]
        self.interests = np.stack([rng.choice(c, cfg.interests, replace=False, p=self.cat_p)
                                   for _ in range(cfg.users)])

    def draw_items(self, cats, rng):
        """An item of each row's category, by its popularity within it (rows grouped by category once)."""
        out = np.empty(len(cats), np.int64)
        u = rng.random(len(cats))
        order = np.argsort(cats, kind="stable")
        present, starts = np.unique(cats[order], return_index=True)
        for c, rows in zip(present.tolist(), np.split(order, starts[1:])):
            idx = np.minimum(np.searchsorted(self.cat_cdfs[c], u[rows]), len(self.cat_items[c]) - 1)
            out[rows] = self.cat_items[c][idx]
        return out


def _walk(cfg: SyntheticConfig, world: "_World", lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each user's categories, `[users, longest]`: a session stays with probability
    `p_session`, else moves to one of the user's interests, a related category or a
    popular one, or returns to a category `recall_lag` clicks back."""
    n, steps = len(lengths), int(lengths.max())
    cats = np.zeros((n, steps), np.int64)
    session = rng.choice(world.interests.shape[1], n)
    session = world.interests[np.arange(n), session]
    for t in range(steps):
        u = rng.random(n)
        stay = u < cfg.p_session
        v = rng.random(n)
        new = np.where(v < cfg.p_interest,
                       world.interests[np.arange(n), rng.integers(0, cfg.interests, n)],
                       np.where(v < cfg.p_interest + cfg.p_related, world.related[session],
                                rng.choice(cfg.categories, n, p=world.cat_p)))
        if cfg.p_return > 0 and t >= cfg.recall_lag[0]:
            lag = rng.integers(cfg.recall_lag[0], min(cfg.recall_lag[1], t) + 1, n)
            new = np.where(rng.random(n) < cfg.p_return, cats[np.arange(n), t - lag], new)
        session = np.where(stay, session, new)
        cats[:, t] = session
    return cats


def _times(cfg: SyntheticConfig, lengths: np.ndarray, flat_users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The clicks' Unix times: gaps of a minute, or two hours between sessions;
    with `days`, each user's clicks spread from its start in day 1 to day `days`."""
    clicks = len(flat_users)
    gaps = np.where(rng.random(clicks) < 0.1, rng.exponential(7200, clicks), rng.exponential(60, clicks))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    times = np.cumsum(gaps)
    offsets = times - times[np.repeat(starts, lengths)]  # each user's clicks from its first
    if cfg.days:  # scaled onto the days: first click in day 1 (at the user's start), last in day `days`
        span = np.maximum(np.maximum.reduceat(offsets, starts), 1.0)
        offsets = offsets / np.repeat(span, lengths) * (cfg.days - 1) * 86400
    start = 1511481600 if cfg.days else 1511500000  # (with days: midnight UTC, so day 1 is the first UTC day)
    return start + (offsets + rng.uniform(0, 86400, len(lengths))[flat_users]).astype(np.int64)


def generate(cfg: SyntheticConfig):
    """Returns (rows as dict of arrays in Taobao column order, truth dict)."""
    rng = np.random.default_rng(cfg.seed)
    world = _World(cfg, rng)
    n_users = cfg.users
    if not 1 <= cfg.min_length <= cfg.length_median <= cfg.max_length:
        raise ValueError(f"min_length={cfg.min_length}, length_median={cfg.length_median}, "
                         f"max_length={cfg.max_length}: need 1 <= min_length <= length_median <= max_length")
    lengths = np.clip(np.round(rng.lognormal(np.log(cfg.length_median), cfg.length_sigma, n_users)),
                      cfg.min_length, cfg.max_length).astype(np.int64)
    cats = _walk(cfg, world, lengths, rng)
    valid = np.arange(cats.shape[1])[None, :] < lengths[:, None]
    flat_cats = cats[valid]
    flat_items = world.draw_items(flat_cats, rng)
    flat_users = np.repeat(np.arange(n_users), lengths)
    if cfg.brands:
        item_brand, flat_items = _brands(cfg, flat_users, flat_items, len(world.item_cat), rng)
        flat_cats = world.item_cat[flat_items]
        cats[valid] = flat_cats
    if cfg.p_recall > 0:
        flat_items, flat_cats = _recall(cfg, lengths, flat_items, world, rng)
        cats[valid] = flat_cats
    times = _times(cfg, lengths, flat_users, rng)
    behavior = np.full(len(flat_cats), "pv", dtype=object)
    # Extra non-click events on clicked items, interleaved right after the click.
    extra = rng.random(len(flat_cats)) < cfg.extra_events
    order = np.argsort(np.concatenate([np.arange(len(flat_cats)), np.nonzero(extra)[0]]), kind="stable")
    rows = {
        "user": np.concatenate([flat_users, flat_users[extra]])[order] + 1,
        "item": np.concatenate([flat_items, flat_items[extra]])[order] + 1,
        "category": np.concatenate([flat_cats, flat_cats[extra]])[order] + 1,
        "behavior": np.concatenate([behavior, rng.choice(["buy", "cart", "fav"], extra.sum())])[order],
        "timestamp": np.concatenate([times, times[extra]])[order],
    }
    if cfg.brands:
        rows["brand"] = item_brand[rows["item"] - 1] + 1
    truth = ground_truth(cfg, world, cats, lengths, flat_items, rng)
    return rows, truth


def _brands(cfg: SyntheticConfig, flat_users, flat_items, num_items: int, rng):
    """Every item's brand (uniform over `brands`) and the clicks with brand
    interest planted: with probability `p_brand`, a click becomes an item
    (uniform) of one of its user's `brand_interests` brands."""
    item_brand = rng.integers(0, cfg.brands, num_items)
    favourite = np.stack([rng.choice(cfg.brands, cfg.brand_interests, replace=False)
                          for _ in range(int(flat_users.max()) + 1)])
    by_brand = np.argsort(item_brand, kind="stable")
    starts = np.searchsorted(item_brand[by_brand], np.arange(cfg.brands + 1))
    planted = rng.random(len(flat_items)) < cfg.p_brand
    brand = favourite[flat_users, rng.integers(0, cfg.brand_interests, len(flat_users))]
    size = starts[brand + 1] - starts[brand]
    planted &= size > 0
    pick = starts[brand] + (rng.random(len(flat_items)) * np.maximum(size, 1)).astype(np.int64)
    return item_brand, np.where(planted, by_brand[np.minimum(pick, len(by_brand) - 1)], flat_items)


def _recall(cfg: SyntheticConfig, lengths, flat_items, world, rng):
    """Lifelong re-consumption: from position `recall_lag[0]` on, each click is,
    with probability `p_recall`, the user's own click `lag` steps back (a
    repeat of a repeat repeats the original)."""
    items = np.zeros((len(lengths), int(lengths.max())), np.int64)
    valid = np.arange(items.shape[1])[None, :] < lengths[:, None]
    items[valid] = flat_items
    lo, hi = cfg.recall_lag
    rows = np.arange(len(lengths))
    for t in range(lo, items.shape[1]):
        recall = (rng.random(len(lengths)) < cfg.p_recall) & (t < lengths)
        lag = rng.integers(lo, min(hi, t) + 1, len(lengths))
        items[recall, t] = items[rows[recall], t - lag[recall]]
    flat = items[valid]
    return flat, world.item_cat[flat]


@public("dare_tf.data", name="write_synthetic")
def write(cfg: SyntheticConfig, output: str, string_ids: bool = False) -> dict:
    """Writes the log (`string_ids`: as a log of string ids and calendar times,
    `U000001`, `SKU0000042`, `C0007`, `B012` and `2017-11-25T03:04:05Z`, read
    with `data.prepare --string_ids`; its truth file then holds no planted
    `related_category`, whose ids are the integer log's) and `<output>.truth.json`."""
    claim_output(output)
    rows, truth = generate(cfg)
    if string_ids:
        from dare_tf.data.logs.string_ids import as_string_log

        rows = as_string_log(rows)
        truth = {k: v for k, v in truth.items() if k != "related_category"}
    table = pa.table({k: pa.array(v.tolist() if v.dtype == object else v) for k, v in rows.items()})
    tmp = output + ".tmp"
    pacsv.write_csv(table, tmp, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    os.replace(tmp, output)
    truth["rows"] = int(table.num_rows)
    with open(truth_path(output), "w") as f:
        json.dump(truth, f, indent=1)
    return truth

