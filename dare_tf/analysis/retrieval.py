"""Search-stage quality: how well each model's stage-1 ranking of a history
retrieves the behaviours that truly matter for the target (NDCG@K against
ground-truth gains)."""

from __future__ import annotations

import json
import os

import numpy as np

from dare_tf._faces import public


@public("dare_tf.analysis")
def ndcg_at_k(gains: np.ndarray, scores: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """NDCG@K per row: `gains`, `scores`, `valid` are `[N, L]`; the K valid slots
    with the highest score are taken in score order, each contributing its gain
    divided by log2(rank + 1), and the sum is divided by the same sum over the K
    valid slots with the highest gains. Rows whose ideal sum is 0 give NaN."""
    gains = np.where(valid, np.asarray(gains, np.float64), 0.0)
    k = min(k, gains.shape[1])
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    # A stable sort on the negated score: ties keep slot order.
    order = np.argsort(-np.where(valid, scores, -np.inf), axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(gains, order, axis=1)  # (padding's gain is 0 already)
    ideal = -np.sort(-gains, axis=1)[:, :k]
    dcg, idcg = chosen @ discount, ideal @ discount
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / idcg, np.nan)


def mean_with_interval(values: np.ndarray) -> dict:
    """Mean, its 95% normal interval and the count, over the finite values."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "count": 0}
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
    return {"mean": float(values.mean()), "low": float(values.mean() - half),
            "high": float(values.mean() + half), "count": int(len(values))}


def paired_difference(a: np.ndarray, b: np.ndarray) -> dict:
    """The mean of `a - b` over the examples where both are finite, and its standard
    error: `{"mean", "se", "count"}`."""
    difference = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    difference = difference[np.isfinite(difference)]
    se = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else float("nan")
    return {"mean": float(difference.mean()) if len(difference) else float("nan"), "se": float(se),
            "count": int(len(difference))}


# The population behind the paper's NDCG numbers (../shared/docs/reference.md): target
# categories with at least 700 training examples; examples with at most 20 of their 200
# behaviours in (target category, behaviour category, position) cells with fewer than 50
# positives or 50 negatives; and its NDCG cut.
PAPER_MIN_TARGET_EXAMPLES, PAPER_MAX_THIN, PAPER_LENGTH, PAPER_MIN_CELL, PAPER_K = 700, 20, 200, 50, 20


def paper_population(counts, target_categories, history_categories) -> tuple[np.ndarray, dict]:
    """Which examples the paper's NDCG keeps `[N]` (see `PAPER_MIN_TARGET_EXAMPLES`;
    at a history length L other than 200, at most 20 * L / 200 thin behaviours), and
    the counts that decide it: `test_examples`, `frequent_target` (a target
    category with enough training examples), `kept`, `max_thin`."""
    tc = np.asarray(target_categories, np.int64)
    hc = np.asarray(history_categories, np.int64)
    positions = np.arange(hc.shape[1], 0, -1)[None, :]
    positives, negatives = counts.lookup(tc[:, None], hc, positions)
    real = hc > 0
    thin = real & ((positives < PAPER_MIN_CELL) | (negatives < PAPER_MIN_CELL))
    max_thin = int(round(PAPER_MAX_THIN * hc.shape[1] / PAPER_LENGTH))
    frequent = counts.target_examples()[tc] >= PAPER_MIN_TARGET_EXAMPLES
    keep = frequent & (thin.sum(axis=1) <= max_thin) & real.any(axis=1)
    return keep, {"test_examples": int(len(tc)), "frequent_target": int(frequent.sum()), "kept": int(keep.sum()),
                  "max_thin": max_thin}


def mutual_information_gains(counts, target_categories, history_categories) -> np.ndarray:
    """Ground-truth gain of every history slot `[N, L]`: the mutual information of
    its (category, position) with the label given the target's category
    (`CooccurrenceCounts`); 0 on padding."""
    hc = np.asarray(history_categories, np.int64)
    length = hc.shape[1]
    positions = np.arange(length, 0, -1)[None, :]
    gains = counts.mutual_information(np.asarray(target_categories, np.int64)[:, None], hc, positions)
    return np.where(hc > 0, gains, 0.0)


def load_planted_truth(source_log: str) -> dict | None:
    """The synthetic generator's `<log>.truth.json`, or None for a real log."""
    path = source_log + ".truth.json"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        truth = json.load(f)
    return truth if "related_category" in truth and "per_lag" in truth else None


@public("dare_tf.analysis")
def planted_gains(truth: dict, raw_target_categories, raw_history_categories) -> np.ndarray:
    """Planted relevance `[N, L]` of every history slot for its target, from the
    generator's truth: the probability, at the slot's lag, that the next click's
    category equals the behaviour's (when the target has the behaviour's
    category) or is its related category (when the target's category is the
    related one); 0 for unrelated categories and padding. Raw category ids
    (strings or ints as in the log), padding as 0."""
    hc = np.asarray(raw_history_categories, np.int64)
    tc = np.asarray(raw_target_categories, np.int64)
    length = hc.shape[1]
    lags = np.arange(length, 0, -1)
    same = np.zeros(length + 1)
    related = np.zeros(length + 1)
    for row in truth["per_lag"]:
        if row["lag"] <= length:
            same[row["lag"]], related[row["lag"]] = row["p_same_category"], row["p_related_category"]
    partner = np.asarray(truth["related_category"], np.int64)  # raw id -> raw id of its pair
    is_same = hc == tc[:, None]
    is_related = partner[np.clip(hc, 0, len(partner) - 1)] == tc[:, None]
    gains = np.where(is_same, same[lags][None, :], np.where(is_related, related[lags][None, :], 0.0))
    return np.where(hc > 0, gains, 0.0)
