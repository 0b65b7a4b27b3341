"""The two-stage recommender's verdict: what a cascade evaluation or a retrieval run
says is wrong with it (`dare_tf.retrieval.cascade`, `dare_tf.retrieval.training`)."""

from __future__ import annotations
from dare_tf._faces import public


@public("dare_tf.retrieval")
def cascade_warnings(results: dict, baselines=()) -> list[str]:
    """What a cascade evaluation (or a retrieval run: `quotas` and `sources`) says is
    wrong: a ranker whose HitRate@k is not above the retrieval order's by more than
    two standard errors of their paired difference, a source with a quota of 0, and
    a two-tower whose recall is below a heuristic source's. The rankers named in
    `baselines` are shown for comparison: their rows are `cascade_notes`, not
    warnings."""
    warnings = []
    k = results.get("config", {}).get("k")
    for name, row in results.get("rankers", {}).items():
        gain, se = row[f"hit_rate@{k}_vs_retrieval"], row[f"hit_rate@{k}_vs_retrieval_se"]
        if not gain > 2 * se and name not in baselines:
            below = gain < -2 * se
            warnings.append(f"{name} {'ranks below' if below else 'does not beat'} the retrieval order beyond noise: "
                            f"{_against_retrieval(results, row, k)}: reranking makes these recommendations "
                            f"{'worse' if below else 'no better'}; train the ranker on the candidates it ranks "
                            "(trainers.train --negatives=uniform:8,retrieval:8 --retrieval_run=RUN, docs/two-stage.md)")
    for source, quota in results.get("quotas", {}).items():
        if quota == 0:
            warnings.append(f"the quotas give the {source} source no candidates (quota 0, chosen on validation): the "
                            "retrieval stage does not use it")
    recall = {name: next(iter(row.values())) for name, row in results.get("sources", {}).items()}
    heuristics = {name: value for name, value in recall.items() if name != "two_tower"}
    if "two_tower" in recall and heuristics and recall["two_tower"] < max(heuristics.values()):
        best = max(heuristics, key=heuristics.get)
        metric = next(iter(results["sources"]["two_tower"]))
        warnings.append(f"the two-tower's {metric} ({recall['two_tower']:.4f}) is below the {best} source's "
                        f"({heuristics[best]:.4f}): the learned retrieval adds less than a heuristic")
    return warnings


def cascade_notes(results: dict, baselines) -> list[str]:
    """One line per ranker of `baselines` (shown for comparison, trained for another
    task: the paper's random negatives): what its row shows, beside the retrieval
    order, in the words of `cascade_warnings` without its advice."""
    k = results.get("config", {}).get("k")
    notes = []
    for name in baselines:
        row = results.get("rankers", {}).get(name)
        if row is None:
            continue
        gain, se = row[f"hit_rate@{k}_vs_retrieval"], row[f"hit_rate@{k}_vs_retrieval_se"]
        where = "above" if gain > 2 * se else "below" if gain < -2 * se else "level with"
        notes.append(f"{name} (for comparison: not trained on the candidates it reorders) ranks {where} the retrieval "
                     f"order: {_against_retrieval(results, row, k)}")
    return notes


def _against_retrieval(results: dict, row: dict, k: int) -> str:
    """A ranker's HitRate@k beside the retrieval order's, with their paired difference."""
    gain, se = row[f"hit_rate@{k}_vs_retrieval"], row[f"hit_rate@{k}_vs_retrieval_se"]
    return (f"HitRate@{k} {row[f'hit_rate@{k}']:.4f} vs {results['retrieval'][f'hit_rate@{k}']:.4f} "
            f"(difference {gain:+.4f} +/- {se:.4f}, one standard error)")
