"""Recall of the merged candidates (`dare_tf.retrieval.candidates`) on held-out
positives, for many quota choices at once, in batches whose `[B, catalogue]`
tower scores stay bounded (`score_rows`)."""

from __future__ import annotations

import numpy as np

from dare_tf.retrieval.candidates import CandidateMerger, Query, quota_key


SCORES_PER_BATCH = 1 << 27  # tower scores one batch holds at most ([B, C] float32: 512 MB)


def score_rows(catalogue: int, batch_size: int) -> int:
    """Histories scored at once against a catalogue of `catalogue` items: at most
    `batch_size`, and few enough that their `[B, catalogue]` scores stay under
    SCORES_PER_BATCH (at 4.16M items, 32 rows, not 256 rows' 4 GB)."""
    return max(1, min(batch_size, SCORES_PER_BATCH // max(catalogue, 1)))


def evaluate_sources(merger: CandidateMerger, tower_scores_fn, examples: dict, quota_choices, ks,
                     include_seen: bool = False, batch_size: int = 256) -> dict:
    """Recall@k of the positives `examples` (dense `hist_items`, `hist_categories`,
    `target_item`) for each quota dict of `quota_choices`: `{quota key: {"recall@k":
    ...}}`, keyed by `quota_key(quotas)`. `tower_scores_fn(hist_items,
    hist_categories)` gives `[B, C]` scores. Each batch's proposals are read once
    for every quota choice."""
    n = max(ks)
    batch_size = score_rows(merger.size, batch_size)
    choices = {quota_key(q): q for q in quota_choices}  # (a choice listed twice is counted once)
    hits = {key: np.zeros(len(ks)) for key in choices}
    count = len(examples["target_item"])
    for start in range(0, count, batch_size):
        items = examples["hist_items"][start: start + batch_size].astype(np.int32)
        cats = examples["hist_categories"][start: start + batch_size].astype(np.int32)
        target = examples["target_item"][start: start + batch_size].astype(np.int64) - 1
        proposals = merger.proposals(Query(tower_scores_fn(items, cats), items, cats), n)
        for key, q in choices.items():
            top = merger.merge(proposals, q, items, n, include_seen).numpy()
            found = top == target[:, None]
            position = np.where(found.any(axis=1), found.argmax(axis=1), n)
            hits[key] += [(position < k).sum() for k in ks]
    return {q: {f"recall@{k}": float(h / max(count, 1)) for k, h in zip(ks, hit)} for q, hit in hits.items()}
