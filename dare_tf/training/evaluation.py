"""Evaluation on either engine: the evaluation batch, exact metrics overall and
by history length from a split's predictions, multi-seed summaries and the
results table. No backend: each engine predicts
(`dare_tf.training.engines.tensorflow.prediction`, the JAX engine's state)."""

from __future__ import annotations

import numpy as np

from dare_tf import metrics
from dare_tf._faces import public
from dare_tf.training.config import EVAL_BEHAVIOURS, METRICS


@public("dare_tf.training")
def history_length_buckets(max_len: int) -> list[tuple[str, int, int]]:
    """(name, lowest, highest) history-length buckets: 1-9, 10-49, 50-(L-1), and
    `full` (= L), cut where L is shorter."""
    edges, buckets = [1, 10, 50], []
    for lo, hi in zip(edges, edges[1:] + [max_len]):
        hi = min(hi, max_len) - 1
        if lo <= hi:
            buckets.append((f"{lo}-{hi}", lo, hi))
    return buckets + [("full", max_len, max_len)]


@public("dare_tf.training")
def metrics_by_history_length(outputs: dict[str, np.ndarray], max_len: int) -> dict[str, dict]:
    """Metrics and example count per history-length bucket (empty buckets left out)."""
    out = {}
    lengths = outputs["history_length"]
    for name, lo, hi in [("0", 0, 0)] + history_length_buckets(max_len):
        sel = (lengths >= lo) & (lengths <= hi)
        if sel.any():
            out[name] = dict(count=int(sel.sum()), **metrics.evaluate(
                outputs["labels"][sel], outputs["probabilities"][sel], outputs["users"][sel],
                outputs["categories"][sel]))
    return out


@public("dare_tf.training")
def evaluate_outputs(outputs: dict[str, np.ndarray]) -> dict[str, float]:
    return metrics.evaluate(outputs["labels"], outputs["probabilities"], outputs["users"],
                            outputs["categories"])


def evaluation_batch(config, max_len: int, counts=None) -> int:
    """The evaluation batch: `eval_batch_size`, capped so that a batch holds at
    most `EVAL_BEHAVIOURS` behaviours (at least the training batch); for splits
    held in memory (`counts`, their sizes) and small, the power of two that holds
    the largest of them (padding 258 validation examples to a batch of 8192 took
    1.6 GB of activations at L=200: benchmarks/bench_memory.py); in reference
    mode never smaller, as the reference's per-batch statistics need."""
    cap = max(config.schedule.batch_size, EVAL_BEHAVIOURS // max_len)
    size = min(config.data.eval_batch_size, cap)
    if config.reference_mode or not counts:
        return size
    return min(size, 1 << (max(counts) - 1).bit_length())


@public("dare_tf.training")
def summarize(per_seed: list[dict]) -> dict:
    out = {}
    for split in ("val", "test"):
        values = {m: np.array([r[split][m] for r in per_seed], float) for m in METRICS}
        out[split] = {m: float(v.mean()) for m, v in values.items()}
        out[f"{split}_std"] = {m: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for m, v in values.items()}
    buckets = {}
    for r in per_seed:
        for name, entry in r.get("test_by_history_length", {}).items():
            buckets.setdefault(name, []).append(entry)
    out["test_by_history_length"] = {
        name: {"count": entries[0]["count"], **{m: float(np.array([e[m] for e in entries], float).mean())
                                                for m in METRICS}}  # (None: a NaN read back from JSON)
        for name, entries in buckets.items()}
    if all("test_cascade" in r for r in per_seed):
        out["test_cascade"] = {m: float(np.mean([r["test_cascade"][m] for r in per_seed]))
                               for m in per_seed[0]["test_cascade"]}
    return out


@public("dare_tf.training")
def format_results(results: dict) -> str:
    """The test metrics overall and by history length, as a Markdown table, and
    the run's undertraining warnings beneath it (`dare_tf.training.diagnostics`)."""
    rows = [("all", {"count": None, **results["test"]})]
    rows += list(results.get("test_by_history_length", {}).items())
    lines = ["| history length | examples | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 2) + "|"]
    for name, entry in rows:
        count = "" if entry["count"] is None else f"{entry['count']:,}"
        lines.append(f"| {name} | {count} | " + " | ".join("n/a" if entry[m] is None else f"{entry[m]:.4f}"
                                                          for m in METRICS) + " |")  # (None: NaN in results.json)
    cascade = results.get("test_cascade")
    if cascade:
        k = next(name for name in cascade if name.startswith("hit_rate@")).split("@")[1]
        lines.append(f"cascade, the retrieval run's candidates reordered: HitRate@{k} {cascade[f'hit_rate@{k}']:.4f} "
                     f"(retrieval order {cascade[f'retrieval_hit_rate@{k}']:.4f}), NDCG@{k} "
                     f"{cascade[f'ndcg@{k}']:.4f} (retrieval order {cascade[f'retrieval_ndcg@{k}']:.4f})")
    lines += [f"warning: {w}" for w in results.get("warnings", [])]
    return "\n".join(lines)
