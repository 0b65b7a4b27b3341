"""Exact evaluation metrics: AUC, grouped AUC (user GAUC, category AUC), logloss;
and HitRate@k / NDCG@k of top-k recommendation lists (the cascade evaluation).

All take numpy arrays of a whole evaluation split. AUC is the exact
Mann-Whitney statistic with ties counted as one half (no bucketing).
"""

from __future__ import annotations

import numpy as np

LOGLOSS_EPSILON = 1e-7


def _average_ranks(scores: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank."""
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    boundaries = np.concatenate([[True], sorted_scores[1:] != sorted_scores[:-1], [True]])
    starts = np.nonzero(boundaries)[0]
    avg = (starts[:-1] + starts[1:] + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(avg, np.diff(starts))
    return ranks


def auc(labels, scores) -> float:
    """Exact ROC AUC; NaN when only one class is present."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def grouped_auc(labels, scores, groups) -> float:
    """Impression-weighted mean of per-group AUCs over groups with both classes."""
    labels = np.asarray(labels).reshape(-1)
    scores = np.asarray(scores, np.float64).reshape(-1)
    groups = np.asarray(groups).reshape(-1)
    order = np.argsort(groups, kind="mergesort")
    bounds = np.nonzero(np.concatenate([[True], groups[order][1:] != groups[order][:-1], [True]]))[0]
    total, weight = 0.0, 0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        idx = order[lo:hi]
        value = auc(labels[idx], scores[idx])
        if not np.isnan(value):
            total += value * len(idx)
            weight += len(idx)
    return total / weight if weight else float("nan")


def logloss(labels, probabilities) -> float:
    """Mean binary cross entropy with probabilities clipped to [1e-7, 1 - 1e-7]."""
    y = np.asarray(labels, np.float64).reshape(-1)
    p = np.clip(np.asarray(probabilities, np.float64).reshape(-1), LOGLOSS_EPSILON, 1 - LOGLOSS_EPSILON)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def evaluate(labels, probabilities, users, categories) -> dict[str, float]:
    """`auc`, `gauc` (grouped by user), `category_auc` (grouped by target category), `logloss`."""
    return {
        "auc": auc(labels, probabilities),
        "gauc": grouped_auc(labels, probabilities, users),
        "category_auc": grouped_auc(labels, probabilities, categories),
        "logloss": logloss(labels, probabilities),
    }


# A cascade's defaults: the retrieval stage hands the ranker N candidates; quality is read in its top k.
CASCADE_CANDIDATES = 200
CASCADE_K = 10


def rank_of(ids: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The 0-based position of `target[i]` in the list `ids[i]`, -1 when absent."""
    found = np.asarray(ids) == np.asarray(target)[:, None]
    return np.where(found.any(axis=1), found.argmax(axis=1), -1)


def hits_and_gains(ranks, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, with one relevant item each: whether it is in the top `k` (0/1)
    and its NDCG@k gain, from `ranks`, its 0-based position in each query's ranked
    list (-1 when it is not in the list). A hit at position r gains 1 / log2(r + 2)."""
    ranks = np.asarray(ranks).reshape(-1)
    hit = (ranks >= 0) & (ranks < k)
    return hit.astype(np.float64), np.where(hit, 1.0 / np.log2(np.maximum(ranks, 0) + 2.0), 0.0)


def hit_rate_and_ndcg(ranks, k: int) -> tuple[float, float]:
    """HitRate@k and NDCG@k: the means of `hits_and_gains`."""
    hit, gain = hits_and_gains(ranks, k)
    return float(hit.mean()), float(gain.mean())


def standard_error(values) -> float:
    """The standard error of the mean of per-query values (sample std / sqrt(n))."""
    values = np.asarray(values, np.float64).reshape(-1)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
