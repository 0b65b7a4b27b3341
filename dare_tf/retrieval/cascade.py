"""Cascade evaluation: the retrieval stage alone, and followed by each ranker.

`evaluate_cascade(data_dir, retrieval_run, {"dare": run, ...}, output_dir)`
takes the test split's positive examples (a user's history and the item they
clicked next), lets the retrieval stage pick its first N candidates of the
whole catalogue (the run's merged sources, `dare_tf.retrieval.candidates`),
and lets each ranker reorder those N. For each order of the same N (the
retrieval order, a popularity order by training click share, each ranker's)
it reports HitRate@k and NDCG@k of the clicked item with their standard
errors, and the retrieval stage's recall at N (the ceiling any ranker can
reach). Its verdict is a list of warnings (`cascade_warnings`): a ranker that
does not beat the retrieval order beyond noise (its paired difference in
HitRate@k within two standard errors, or below), a source the quotas leave
out, a two-tower whose recall is below a heuristic source's.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np

from dare_tf._faces import public
from dare_tf._files import atomic_json
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.schema import TARGET_ITEM
from dare_tf.run_directory import RunDirectory
from dare_tf.metrics import CASCADE_CANDIDATES, CASCADE_K, hits_and_gains, rank_of, standard_error
from dare_tf.retrieval.candidates import SOURCES, one_source, quota_key
from dare_tf.retrieval.evaluation import evaluate_sources
from dare_tf.retrieval.verdict import cascade_notes, cascade_warnings
from dare_tf.retrieval.training import RetrievalStage, positive_columns, positives, tower_scores
from dare_tf.reranking import rerank

CASCADE_FILE = "cascade.json"


@public("dare_tf.retrieval")
def evaluate_cascade(data_dir: str, retrieval_run: str, ranking_runs: dict[str, str], output_dir: str,
                     num_candidates: int = CASCADE_CANDIDATES, k: int = CASCADE_K, max_examples: int | None = None,
                     report: Callable[[str], None] = print, overwrite: bool = False, baselines=()) -> dict:
    """Writes and returns `output_dir/cascade.json`: `retrieval` (`hit_rate@k`,
    `ndcg@k`, `recall@N`) and `rankers` (per name, `hit_rate@k` and `ndcg@k` of
    retrieval's top-N reordered by that ranker), over the test positives (the
    first `max_examples` if given). Runs trained on another dataset are refused;
    an existing cascade.json of another configuration is replaced only with
    `overwrite` (it is this function's own file). `baselines`: names of
    `ranking_runs` shown for comparison, whose rows get a note saying what they
    show, not a warning (`dare_tf.retrieval.verdict`)."""
    if num_candidates < 1 or k < 1 or k > num_candidates:
        raise ValueError(f"num_candidates={num_candidates}, k={k}: need 1 <= k <= num_candidates")
    spec = DatasetSpec.load(data_dir)
    config = {"data_dir": os.path.abspath(data_dir), "dataset_fingerprint": spec.fingerprint(),
              "retrieval_run": os.path.abspath(retrieval_run),
              "ranking_runs": {name: os.path.abspath(d) for name, d in ranking_runs.items()},
              "num_candidates": num_candidates, "k": k, "max_examples": max_examples}
    path = os.path.join(output_dir, CASCADE_FILE)
    if os.path.exists(path):
        with open(path) as f:
            previous = json.load(f).get("config")
        if previous != config and not overwrite:
            raise ValueError(f"{path} holds a cascade evaluation of another configuration ({previous}); "
                             "choose another --output_dir, or --overwrite to replace it")
    stage = RetrievalStage.load(data_dir, retrieval_run)
    stage.require_candidates(num_candidates, "num_candidates")
    rankers = {name: RunDirectory(run_dir).trained_model(spec.fingerprint(), name)
               for name, run_dir in ranking_runs.items()}
    splits, quotas, include_seen = stage.splits, stage.quotas, stage.include_seen
    examples = positives(splits["test"])
    if max_examples is not None:
        examples = {key: value[:max_examples] for key, value in examples.items()}
    candidates = stage.candidates(examples, num_candidates)
    target = examples[TARGET_ITEM].astype(np.int64)
    ranks = rank_of(candidates, target)
    retrieval_hits = hits_and_gains(ranks, k)
    clicks = np.bincount(positive_columns(splits["train"])[TARGET_ITEM], minlength=spec.num_items)
    by_popularity = np.take_along_axis(candidates, np.argsort(-clicks[candidates], axis=1, kind="stable"), axis=1)
    # Each source alone: one pass that reads the proposals once and merges with each source's quotas.
    alone = evaluate_sources(stage.merger, tower_scores(stage.model, (stage.items, stage.categories)), examples,
                             [one_source(name) for name in SOURCES], [num_candidates], include_seen)
    sources = {name: alone[quota_key(one_source(name))][f"recall@{num_candidates}"] for name in SOURCES}
    results = {"config": config, "examples": int(len(target)), "catalogue": int(len(stage.items)),
               "quotas": quotas, "include_seen": include_seen,
               "retrieval": dict(_order_metrics(retrieval_hits, retrieval_hits, k),
                                 **{f"recall@{num_candidates}": float((ranks >= 0).mean())}),
               "popularity_order": _order_metrics(hits_and_gains(rank_of(by_popularity, target), k), retrieval_hits,
                                                  k),
               "sources": {name: {f"recall@{num_candidates}": v} for name, v in sources.items()}, "rankers": {}}
    for name, model in rankers.items():
        reordered = rerank(model, examples, candidates, stage.category_of)
        results["rankers"][name] = _order_metrics(hits_and_gains(rank_of(reordered, target), k), retrieval_hits, k)
    results["warnings"] = cascade_warnings(results, baselines)
    results["notes"] = cascade_notes(results, baselines)
    os.makedirs(output_dir, exist_ok=True)
    atomic_json(path, results)
    report(format_cascade(results))
    return results


def _order_metrics(hits: tuple, retrieval: tuple, k: int) -> dict:
    """HitRate@k and NDCG@k of one order of the candidates with their standard errors,
    and its paired difference in HitRate@k from the retrieval order (per query, the
    same queries) with that difference's standard error."""
    (hit, gain), difference = hits, hits[0] - retrieval[0]
    return {f"hit_rate@{k}": float(hit.mean()), f"hit_rate@{k}_se": standard_error(hit),
            f"ndcg@{k}": float(gain.mean()), f"ndcg@{k}_se": standard_error(gain),
            f"hit_rate@{k}_vs_retrieval": float(difference.mean()),
            f"hit_rate@{k}_vs_retrieval_se": standard_error(difference)}


@public("dare_tf.retrieval")
def format_cascade(results: dict) -> str:
    """A markdown table of `evaluate_cascade`'s results (each value +/- one standard
    error), its warnings beneath."""
    k, n = results["config"]["k"], results["config"]["num_candidates"]
    sources = ", ".join(f"{name} {row[f'recall@{n}']:.4f}" for name, row in results.get("sources", {}).items())

    def row(stage, values):
        return (f"| {stage} | {values[f'hit_rate@{k}']:.4f} +/- {values[f'hit_rate@{k}_se']:.4f} | "
                f"{values[f'ndcg@{k}']:.4f} +/- {values[f'ndcg@{k}_se']:.4f} | "
                f"{values[f'hit_rate@{k}_vs_retrieval']:+.4f} +/- {values[f'hit_rate@{k}_vs_retrieval_se']:.4f} |")

    lines = [f"{results['examples']:,} test positives, catalogue {results['catalogue']:,} items; "
             f"retrieval recall@{n} (the rankers' ceiling): {results['retrieval'][f'recall@{n}']:.4f} merged"
             + (f" (each source alone: {sources})" if sources else ""),
             f"| order of the top-{n} | HitRate@{k} | NDCG@{k} | HitRate@{k} - retrieval's |", "|---|---|---|---|",
             row("retrieval", results["retrieval"]), row("popularity", results["popularity_order"])]
    lines += [row(f"{name} (reranked)", values) for name, values in results["rankers"].items()]
    lines += [f"note: {n}" for n in results.get("notes", [])] + [f"warning: {w}" for w in results.get("warnings", [])]
    return "\n".join(lines)
