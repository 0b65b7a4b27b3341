"""Reranking inside a cascade: the retrieval stage's candidates of each positive
example reordered by a ranker (`rerank`), and the HitRate@k and NDCG@k of the
clicked item in that order (`CascadeExamples`). A low module: the trainer (at
every validation, with a retrieval run: `dare_tf.training.reranking`), the
cascade evaluation (`dare_tf.retrieval.cascade`) and the analyses import it,
and it imports none of them."""

from __future__ import annotations

import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.schema import CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS
from dare_tf.metrics import CASCADE_K, hits_and_gains, rank_of


@public("dare_tf.training")
def rerank(model, histories: dict, candidates: np.ndarray, category_of: np.ndarray, rows_per_call: int = 8192):
    """Each example's candidates `[E, N]` reordered by the ranker's click probability
    (stable: ties keep the retrieval order), scored user-major as serving's `rank`
    scores them (`DareModel.rank`: each history (`histories`' dense `hist_items`,
    `hist_categories` `[E, L]`) looked up once for its N)."""
    count, n = candidates.shape
    per_call = max(rows_per_call // n, 1)
    reordered = np.empty_like(candidates)
    for start in range(0, count, per_call):
        ids = candidates[start: start + per_call]
        b = len(ids)
        inputs = {CANDIDATE_ITEMS: ids.astype(np.int32), CANDIDATE_CATEGORIES: category_of[ids].astype(np.int32),
                  HIST_ITEMS: np.asarray(histories[HIST_ITEMS][start: start + b], np.int32),
                  HIST_CATEGORIES: np.asarray(histories[HIST_CATEGORIES][start: start + b], np.int32)}
        probability = np.asarray(model.rank(inputs))
        order = np.argsort(-probability, axis=1, kind="stable")
        reordered[start: start + b] = np.take_along_axis(ids, order, axis=1)
    return reordered


@public("dare_tf.training")
class CascadeExamples:
    """One split's positives inside the cascade: their histories (at the ranker's
    L), the retrieval stage's candidates `[P, N]` and the clicked items `[P]`.

    Args:
        histories: dense `hist_items`, `hist_categories` `[P, L]`.
        candidates: `[P, N]` dense ids, in the retrieval order.
        target: `[P]` the clicked items.
        category_of: the category of every dense item id.
        k: the cutoff of HitRate@k and NDCG@k.
    """

    def __init__(self, histories: dict, candidates: np.ndarray, target: np.ndarray, category_of: np.ndarray,
                 k: int = CASCADE_K):
        self.histories, self.candidates, self.k = histories, np.asarray(candidates), k
        self.target, self.category_of = np.asarray(target, np.int64), np.asarray(category_of, np.int64)

    def __len__(self) -> int:
        return len(self.target)

    def retrieval_hits(self) -> tuple[np.ndarray, np.ndarray]:
        """Per positive, the hit and NDCG gain at k of the retrieval order."""
        return hits_and_gains(rank_of(self.candidates, self.target), self.k)

    def hits(self, model) -> tuple[np.ndarray, np.ndarray]:
        """Per positive, the hit and NDCG gain at k of the candidates reordered by `model`."""
        reordered = rerank(model, self.histories, self.candidates, self.category_of)
        return hits_and_gains(rank_of(reordered, self.target), self.k)

    def metrics(self, model, retrieval: bool = True, combine=None) -> dict[str, float]:
        """`hit_rate@k` and `ndcg@k` of the reordered candidates and, with
        `retrieval`, the retrieval order's (`retrieval_hit_rate@k`,
        `retrieval_ndcg@k`). `combine` (`gather_workers`) joins every worker's
        per-positive values first."""
        values = dict(zip(("hit_rate", "ndcg"), self.hits(model)))
        if retrieval:
            values.update(zip(("retrieval_hit_rate", "retrieval_ndcg"), self.retrieval_hits()))
        if combine is not None:
            values = combine(values)
        return {f"{name}@{self.k}": float(np.mean(v)) for name, v in values.items()}


__all__ = ["CascadeExamples", "rerank"]
