"""Evaluation: predictions over a split, exact metrics overall and by history length,
BatchNorm statistics refreshed for the current weights, multi-seed summaries.
The metrics need no TensorFlow (the trainer on JAX uses them); the predictions
and the refresh on TensorFlow import it when first called."""

from __future__ import annotations

import functools

import weakref

import numpy as np

from dare_tf import metrics
from dare_tf._faces import public
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.schema import HIST_ITEMS, TARGET_CATEGORY, USER
from dare_tf.model.inputs import input_keys
from dare_tf.model.dare_model import DareModel
from dare_tf.training.config import METRICS


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


# Each model's traced functions, dropped with the model.
_FUNCTIONS: "weakref.WeakKeyDictionary[DareModel, dict]" = weakref.WeakKeyDictionary()


def _compiled(model: DareModel, what: str, training: bool = False):
    """The model's graph function for `predict` (probabilities of a feature dict) or
    `moments` (the mean and variance over the batch of each BatchNorm layer's input),
    traced once per model."""
    import tensorflow as tf

    cache = _FUNCTIONS.setdefault(model, {})
    if (what, training) not in cache:
        if what == "predict":
            keys = input_keys(model.model_config.fields)
            fn = lambda x: model.forward({k: x[k] for k in keys}, training=training)["probability"]  # noqa: E731
        else:  # (each BatchNorm input's mean and variance over the batch, computed in the graph)
            norms = model.batch_norm_layers()
            fn = lambda x: {k: tf.nn.moments(tf.cast(v, tf.float32), axes=[0])  # noqa: E731
                            for k, v in model.forward(x, training=False).items() if k in norms}
        # (a partial: TensorFlow counts traces by the function's code, which every model's lambda
        # shares, and would warn of "retracing" after five models in one process; a partial has none)
        function = tf.function(functools.partial(fn), autograph=False, reduce_retracing=True)
        cache[(what, training)] = functools.partial(_for_any_batch_size, function)
    return cache[(what, training)]


def _for_any_batch_size(function, x: dict):
    """`function(x)`, traced the first time for any batch size: a split's partial last
    batch (or the next split's size) calls the same graph instead of tracing the model
    again (a trace costs more than most evaluations here)."""
    import tensorflow as tf

    if not function.experimental_get_tracing_count():
        function.get_concrete_function({k: tf.TensorSpec([None, *v.shape[1:]], v.dtype) for k, v in x.items()})
    return function(x)


@public("dare_tf.training")
def predict_split(model: DareModel, data_dir: str, split: str, batch_size: int, spec: DatasetSpec,
                  drop_remainder: bool = False, training: bool = False, partitions=None) -> dict[str, np.ndarray]:
    """Predictions over a whole split (or its `partitions`): `labels`,
    `probabilities`, `users`, `categories` and `history_length` arrays, in the
    split's file order."""
    from dare_tf.data.feeding.pipeline import make_dataset

    ds = make_dataset(data_dir, split, batch_size, shuffle=False, drop_remainder=drop_remainder,
                      deterministic=True, spec=spec, max_len=model.model_config.max_len, partitions=partitions)
    return predict_batches(model, ds, training, f"{data_dir}: the {split} split")


@public("dare_tf.training")
def predict_batches(model: DareModel, batches, training: bool = False,
                    what: str = "the data") -> dict[str, np.ndarray]:
    """`predict_split`'s arrays over `(features, label)` batches."""
    predict = _compiled(model, "predict", training)
    parts: dict[str, list] = {k: [] for k in ("labels", "probabilities", "users", "categories",
                                                "history_length")}
    for x, y in batches:
        parts["probabilities"].append(predict(x).numpy())
        parts["labels"].append(y.numpy())
        parts["users"].append(x[USER].numpy())
        parts["categories"].append(x[TARGET_CATEGORY].numpy())
        parts["history_length"].append((x[HIST_ITEMS].numpy() > 0).sum(axis=1))
    if not parts["labels"]:
        raise ValueError(f"{what} has no complete batch")
    return {k: np.concatenate(v) for k, v in parts.items()}


@public("dare_tf.training")
def evaluate_outputs(outputs: dict[str, np.ndarray]) -> dict[str, float]:
    return metrics.evaluate(outputs["labels"], outputs["probabilities"], outputs["users"],
                            outputs["categories"])


@public("dare_tf.training")
def refresh_batch_norm_statistics(model: DareModel, batches, combine=None) -> None:
    """Sets each BatchNorm layer's moving mean and variance to the average of the
    per-batch statistics of its input over `batches` (feature dicts) under the
    current weights ("precise BatchNorm"); no weight changes. `combine`
    (`gather_workers`) averages over the batches of every worker."""
    norms = model.batch_norm_layers()
    moments = _compiled(model, "moments")
    sums: dict[str, list] = {}
    count = 0
    for x in batches:
        for name, (mean, variance) in moments({k: x[k] for k in input_keys(model.model_config.fields)}).items():
            total = sums.setdefault(name, [0.0, 0.0])
            total[0] += mean.numpy()
            total[1] += variance.numpy()
        count += 1
    if combine is not None:
        stacked = combine({"count": np.array([count], np.float64),
                           **{f"{n}/{i}": np.asarray(v[i], np.float64)[None] for n, v in sums.items() for i in (0, 1)}})
        count = stacked["count"].sum()
        sums = {n: [stacked[f"{n}/0"].sum(0), stacked[f"{n}/1"].sum(0)] for n in sums}
    for name, (mean, variance) in sums.items():
        norms[name].moving_mean.assign(mean / count)
        norms[name].moving_variance.assign(variance / count)


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
