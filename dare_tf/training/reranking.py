"""A ranker inside its cascade: the retrieval stage's candidates of each
positive example reordered by the ranker, and the HitRate@k and NDCG@k of the
clicked item in that order (`dare_tf.retrieval.cascade` reports them for
finished runs; the trainer, at every validation, when it has a retrieval run)."""

from __future__ import annotations

import numpy as np

from dare_tf.data.negatives import NegativeSampler
from dare_tf.data.pipeline import InMemorySplit
from dare_tf.data.store import load_store
from dare_tf.data.prepared import item_categories
from dare_tf.data.spec import CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS
from dare_tf.metrics import CASCADE_K, hits_and_gains, rank_of


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


class Cascade:
    """What a ranking run needs of its cascade (`CascadeConfig`): the sampler of its
    training negatives (None: the prepared dataset's own) and the validation and
    test positives with the retrieval run's candidates (`examples`; {} without a
    retrieval run). `Cascade.load` returns None when the run uses neither."""

    def __init__(self, sampler, store, examples: dict[str, CascadeExamples]):
        self.sampler, self.store, self.examples = sampler, store, examples

    def train_split(self, seed: int, epochs: int, max_len: int):
        """The training split of one seed: `epochs` epochs of freshly drawn groups."""
        return InMemorySplit(self.sampler.epochs(seed, epochs), self.store, max_len, drawn_epochs=epochs)

    @classmethod
    def load(cls, data_dir: str, spec, config, max_len: int, partitions, memory: dict) -> "Cascade | None":
        cascade = config.cascade
        if not cascade.sources and not cascade.retrieval_run:
            return None
        if cascade.sources and "label" in {role for role, _ in spec.source.get("log", {}).get("columns", [])}:
            raise ValueError(f"--negatives={cascade.negatives}: {data_dir} comes from an impression log, whose "
                             "labelled impressions are the negatives; draw negatives for click logs only")
        if cascade.sources and "train" not in memory:
            raise ValueError(f"--negatives={cascade.negatives} draws each epoch's negatives in memory, but the "
                             f"train split of {data_dir} is larger than --in_memory_mb={config.data.in_memory_mb}; "
                             "raise it (20 bytes per example)")
        splits = {split: memory.get(split) or InMemorySplit.load(data_dir, split, spec, max_len, partitions)
                  for split in ("train", "val", "test")}
        positive = {s: {k: v[split.labels > 0.5] for k, v in split.columns.items() if k != "label"}
                    for s, split in splits.items()}
        store = load_store(data_dir, spec, partitions)
        category_of = item_categories(data_dir, spec, lambda: [(store.items, store.categories)] + [
            (split.columns["target_item"], split.columns["target_category"]) for split in splits.values()])
        tables = {}
        if cascade.retrieval_run:
            from dare_tf.retrieval.training import RetrievalStage  # (tensorflow-recommenders: only here)

            stage = RetrievalStage.load(data_dir, cascade.retrieval_run, "--retrieval_run")
            stage.require_candidates(cascade.candidates, "retrieval_candidates")
            wanted = ["val", "test"] + (["train"] if "retrieval" in dict(cascade.sources) else [])
            tables = {s: stage.candidates(dict(zip((HIST_ITEMS, HIST_CATEGORIES), store.windows(
                positive[s]["uid"], positive[s]["position"], spec.max_len))), cascade.candidates) for s in wanted}
        sampler = None
        if cascade.sources:
            clicks = np.bincount(positive["train"]["target_item"], minlength=spec.num_items)
            sampler = NegativeSampler(positive["train"], cascade.sources, category_of, clicks, tables.get("train"))
        examples = {}
        for split in ("val", "test") if tables else ():
            p = positive[split]
            histories = dict(zip((HIST_ITEMS, HIST_CATEGORIES), store.windows(p["uid"], p["position"], max_len)))
            examples[split] = CascadeExamples(histories, tables[split], p["target_item"], category_of)
        return cls(sampler, store, examples)
