"""The planted truth of a generated log, which analyses and the generators' own
checks read: per history lag, how the behaviour's category relates to the
clicked one (probabilities and mutual information), and the test AUC that the
generator's own probability of each user's last click reaches.

`<output>.truth.json` holds the generator's parameters; per history lag, the
probability that the behaviour's category equals (or is related to) the
next click's category and the mutual information between the two
categories; `related_category` (raw category id -> its related raw id; the
planted truth of which behaviours drive a click, used by
`dare_tf.analysis`); and `generator_auc`, the test AUC that the generator's own
probability of the last click reaches against negatives drawn as the
protocol draws them (by popularity, never an item the user clicked). It is
a reference point, not a ceiling: that rejection makes "the item is already
in the history" a signal the generator's probability does not use, and
trained models do use it.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dare_tf.metrics import auc


def truth_path(output: str) -> str:
    """The truth file beside a generated log."""
    return output + ".truth.json"


def claim_output(output: str) -> None:
    """Refuses, in one line, an `output` the generators would replace without having
    written it (a file without its `truth_path` beside it, or anything but a
    file), or one that cannot be a file (a parent that is a file); creates its
    directory."""
    parent = os.path.dirname(os.path.abspath(output))
    above = parent
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise ValueError(f"--output={output}: {above} is a file, not a directory")
    if os.path.lexists(output):
        if not os.path.isfile(output) or os.path.islink(output):
            raise ValueError(f"--output={output}: exists and is not a regular file; give a new path")
        if not os.path.exists(truth_path(output)):
            raise ValueError(f"--output={output}: exists and was not written by the generator (no "
                             f"{os.path.basename(truth_path(output))} beside it); give a new path, or remove it "
                             "yourself")
    os.makedirs(parent, exist_ok=True)


def mutual_information(a, b, n):
    """Plug-in MI (nats) of two category arrays (ids below `n`), with the
    Miller-Madow bias correction; over the pairs that occur, so its cost grows
    with the arrays, not with `n` squared (9,439 categories: 89M cells)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if n * n <= 8 * len(a):  # (few categories: counted in a table, not sorted)
        joint = np.bincount(a * n + b, minlength=n * n)
        pairs = np.flatnonzero(joint)
        joint = joint[pairs]
    else:
        pairs, joint = np.unique(a * n + b, return_counts=True)
    count_a, count_b = np.bincount(a, minlength=n), np.bincount(b, minlength=n)
    total = float(len(a))
    joint = joint.astype(float)
    expected = count_a[pairs // n].astype(float) * count_b[pairs % n] / total
    mi = float((joint / total * np.log(joint / expected)).sum())
    bias = (len(pairs) - np.count_nonzero(count_a) - np.count_nonzero(count_b) + 1) / (2 * total)
    return max(mi - bias, 0.0)


def next_category_probability(cfg, cat_p, related, interests, session, cats) -> np.ndarray:
    """The generator's P(next category = `cats`), row by row, of users with
    `interests` (`[rows, interests]`) in sessions of category `session`: the
    popular, interest, related and session shares of its walk."""
    p = (1 - cfg.p_session) * (1 - cfg.p_interest - cfg.p_related) * cat_p[cats]
    p = p + np.where((interests == cats[:, None]).any(1), (1 - cfg.p_session) * cfg.p_interest / cfg.interests, 0.0)
    p = p + np.where(related[session] == cats, (1 - cfg.p_session) * cfg.p_related, 0.0)
    return p + np.where(session == cats, cfg.p_session, 0.0)


def ground_truth(cfg, world, cats, lengths, flat_items, rng, max_lag=200, pairs=100_000) -> dict:
    """The truth file of `dare_tf.data.generation.synthetic` (see its docstring): per lag
    up to `max_lag` (over `pairs` sampled behaviours), how a behaviour's category
    relates to the click's; the generator's own AUC of each user's last click;
    the related categories."""
    n_users = cats.shape[0]
    last = lengths - 1
    per_lag = []
    for lag in range(1, min(max_lag, cfg.max_length - 1) + 1):
        # (user, position) pairs whose behaviour `lag` steps back exists.
        users = rng.integers(0, n_users, pairs)
        users = users[lengths[users] > lag]
        if len(users) == 0:
            continue
        t = lag + (rng.random(len(users)) * (lengths[users] - lag)).astype(np.int64)
        target, behaviour = cats[users, t], cats[users, t - lag]
        per_lag.append({
            "lag": lag,
            "p_same_category": float((behaviour == target).mean()),
            "p_related_category": float((world.related[behaviour] == target).mean()),
            "mutual_information": mutual_information(behaviour, target, cfg.categories),
        })
    # The generator's own P(next item | session state, user) for the last click
    # against 2 negatives per user drawn as data.prepare draws them.
    item_freq = np.bincount(flat_items, minlength=len(world.item_cat)).astype(float)
    neg_cdf = np.cumsum(item_freq / item_freq.sum())
    items, labels = [], []
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for u in range(n_users):
        clicked = set(flat_items[starts[u]: starts[u] + lengths[u]].tolist())
        negs = []
        while len(negs) < 2:
            n = int(min(np.searchsorted(neg_cdf, rng.random()), len(neg_cdf) - 1))
            if n not in clicked:
                negs.append(n)
        items += [flat_items[starts[u] + last[u]], *negs]
        labels += [1, 0, 0]
    items, labels = np.array(items, np.int64), np.array(labels)
    users = np.repeat(np.arange(n_users), 3)
    scores = next_category_probability(cfg, world.cat_p, world.related, world.interests[users],
                                       cats[users, last[users] - 1], world.item_cat[items]) * world.item_p_in_cat[items]
    # Raw category id (the log's, 1-based; 0 unused) -> raw id of its related category.
    related = [0] + (world.related + 1).tolist()
    return {"config": dataclasses.asdict(cfg), "generator_auc": auc(labels, scores), "per_lag": per_lag,
            "related_category": related}


def last_click_auc(catalogue, cfg, lengths, cats, items, interests, rng, users=20_000) -> float:
    """The generator's own probability of each sampled user's last click against two
    negatives drawn by popularity that the user never clicked: its test AUC."""
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    chosen = np.flatnonzero(lengths >= 2)
    chosen = rng.choice(chosen, min(users, len(chosen)), replace=False)
    last = start[chosen] + lengths[chosen] - 1
    session, positive = cats[last - 1], items[last]
    clicked = np.unique(np.repeat(np.arange(len(lengths)), lengths) * len(catalogue.item_cat) + items)
    popularity = np.cumsum(np.bincount(items, minlength=len(catalogue.item_cat)) / len(items))
    negatives = np.full((len(chosen), 2), -1)
    while (negatives < 0).any():
        rows = np.flatnonzero((negatives < 0).any(axis=1))
        draw = np.minimum(np.searchsorted(popularity, rng.random((len(rows), 4))), len(popularity) - 1)
        key = chosen[rows, None] * len(catalogue.item_cat) + draw
        at = np.minimum(np.searchsorted(clicked, key), len(clicked) - 1)
        draw[clicked[at] == key] = -1
        for column in range(4):  # (fill each row's empty slots, left to right)
            slot = np.argmax(negatives[rows] < 0, axis=1)
            fill = (negatives[rows, slot] < 0) & (draw[:, column] >= 0)
            negatives[rows[fill], slot[fill]] = draw[fill, column]

    def score(item):
        return next_category_probability(cfg, catalogue.cat_p, catalogue.related, interests[chosen], session,
                                         catalogue.item_cat[item]) * catalogue.item_p[item]

    scores = np.concatenate([score(positive), score(negatives[:, 0]), score(negatives[:, 1])])
    return auc(np.repeat([1, 0, 0], len(chosen)), scores)
