"""A retrieval run's candidates for a ranker's examples: what the `retrieval`
negatives are drawn from, and what a ranker's cascade metrics reorder
(`dare_tf.training.reranking`)."""

from __future__ import annotations

import numpy as np

from dare_tf.data.pipeline import InMemorySplit
from dare_tf.data.spec import SPLITS, DatasetSpec
from dare_tf.retrieval.model import load_retrieval_model
from dare_tf.retrieval.training import candidate_merger, catalogue, merged_candidates, positives
from dare_tf.run_directory import RunDirectory


def candidate_tables(data_dir: str, retrieval_run: str, histories: dict[str, dict], n: int) -> dict[str, np.ndarray]:
    """For each named set of histories (dense `hist_items`, `hist_categories` `[P, L]`,
    oldest first) the retrieval run's first `n` merged candidates `[P, n]` (dense
    ids, best first), as `evaluate_cascade` and the exported retrieval model pick
    them: the run's sources and quotas, already-clicked items excluded unless the
    run includes them. A run of another dataset is refused."""
    spec = DatasetSpec.load(data_dir)
    RunDirectory(retrieval_run).require("retrieval", spec.fingerprint(), "--retrieval_run")  # first: before loading
    splits = {s: InMemorySplit.load(data_dir, s, spec) for s in SPLITS}
    items, categories = catalogue(spec, splits)
    if n > len(items):
        raise ValueError(f"retrieval_candidates={n} is larger than the catalogue of {data_dir} ({len(items)} items)")
    model = load_retrieval_model(retrieval_run, spec, items, categories)
    recorded = RunDirectory(retrieval_run).results()
    merger = candidate_merger(spec, (items, categories), positives(splits["train"]))
    include_seen = recorded["config"].get("include_seen", False)
    return {name: merged_candidates(model, merger, (items, categories), h, recorded["quotas"], n, include_seen)
            for name, h in histories.items()}
