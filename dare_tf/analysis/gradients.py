"""Gradient domination and conflict on the embeddings (the paper's Section 3.2).

A table row that serves both attention and representation (TWIN's shared
embeddings) receives the sum of two gradients: one through the attention
scores, one through the represented vectors. `split_gradients` computes the
two separately in one backward pass, by feeding the model two copies of the
gathered rows, one for the attention roles and one for the representation
roles; their sum is the model's own gradient. `SplitGradientRecorder`, a
callback of the model's own `fit`, records every N steps, per table field, the
norm of each path's gradient and the per-row cosine between them.

TensorFlow backend only (gradient tapes): on another backend the suite asks
`gradient_analysis` of a process on TensorFlow's (`dare_tf._on_tensorflow`).
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np
import tensorflow as tf

from dare_tf._faces import public


_ATTENTION_ROLES = ("target_attention", "history_attention")


@public("dare_tf.analysis")
def split_gradients(model, x, y):
    """One training forward and backward pass of `model` on `(x, y)`.

    Returns `(loss, paths, dense)`: the loss; `paths`, for every embedding
    lookup key `"{set}/{side}/{field}"`, a dict with `table` (the variable),
    `ids`, `attention` and `representation` (the two paths' gradients of the
    gathered rows, zeros where a path does not use the rows); `dense`, the
    gradients of the model's other trainable variables, as `(gradient,
    variable)` pairs.
    """
    from dare_tf.model.inputs import input_keys

    ids = model.example_ids({k: x[k] for k in input_keys(model.model_config.fields)})
    layer = model.embedding
    row_ids = layer.row_ids(*ids.lookup_args())
    tables = {id(table) for table, _ in row_ids.values()}
    dense_vars = [v for v in model.trainable_variables if id(v) not in tables]
    with tf.GradientTape() as tape:
        rows = layer.lookup(*ids.lookup_args())
        copies = {path: {k: tf.identity(v) for k, v in rows.items()} for path in ("attention", "representation")}
        tape.watch(copies)
        by_path = {path: layer.combine(copies[path]) for path in copies}
        emb = {role: by_path["attention" if role in _ATTENTION_ROLES else "representation"][role]
               for role in by_path["attention"]}
        outputs = model.stages_from_embeddings(emb, ids, training=True)
        loss = model.loss_terms(y, outputs)["total"]
    grads = tape.gradient(loss, [copies, dense_vars])
    paths = {}
    for key, (table, key_ids) in row_ids.items():
        paths[key] = {"table": table, "ids": key_ids}
        for path in copies:
            g = grads[0][path][key]
            paths[key][path] = tf.zeros_like(rows[key]) if g is None else tf.convert_to_tensor(g)
    dense = [(g, v) for g, v in zip(grads[1], dense_vars) if g is not None]
    return loss, paths, dense


def table_gradients(paths) -> list:
    """The tables' full gradients (attention + representation paths) as
    `(tf.IndexedSlices, table)` pairs, one per table."""
    per_table: dict[int, list] = {}
    for entry in paths.values():
        table = entry["table"]
        width = table.shape[-1]
        values = tf.reshape(entry["attention"] + entry["representation"], (-1, width))
        indices = tf.reshape(tf.cast(entry["ids"], tf.int64), (-1,))
        per_table.setdefault(id(table), [table, [], []])
        per_table[id(table)][1].append(values)
        per_table[id(table)][2].append(indices)
    return [(tf.IndexedSlices(tf.concat(v, 0), tf.concat(i, 0), tf.shape(t, out_type=tf.int64)), t)
            for t, v, i in per_table.values()]


def _by_row(values, ids, width):
    """Sums gradient rows per id: `(unique ids, [U, width] sums)`."""
    flat_ids = tf.reshape(tf.cast(ids, tf.int64), (-1,))
    unique, index = tf.unique(flat_ids)
    sums = tf.math.unsorted_segment_sum(tf.reshape(values, (-1, width)), index, tf.shape(unique)[0])
    return unique, sums


def path_statistics(paths, fields=("category", "item")) -> dict:
    """Per field: each path's gradient summed per table row over the batch (the
    table's gradient, restricted to the path), the norms of the two, and the
    cosine between them per row (rows with both gradients non-zero).

    With shared tables both paths land on the same rows, and the cosine is the
    paper's conflict measure. With decoupled tables the attention path lands
    on the attention table and the representation path on the representation
    table: norms are reported, cosines are not (`cosines` is None)."""
    out = {}
    for field in fields:
        parts = {"attention": [], "representation": []}
        tables = {"attention": set(), "representation": set()}
        for key, entry in paths.items():
            if not key.endswith("/" + field):
                continue
            for path in parts:
                if float(tf.reduce_sum(tf.abs(entry[path]))) > 0:
                    parts[path].append((entry[path], entry["ids"]))
                    tables[path].add(id(entry["table"]))
        if not parts["attention"] or not parts["representation"]:
            continue
        rows = {}
        for path, pieces in parts.items():
            width = pieces[0][0].shape[-1]
            values = tf.concat([tf.reshape(v, (-1, width)) for v, _ in pieces], 0)
            ids = tf.concat([tf.reshape(tf.cast(i, tf.int64), (-1,)) for _, i in pieces], 0)
            unique, sums = _by_row(values, ids, width)
            rows[path] = dict(zip(unique.numpy().tolist(), sums.numpy()))
        norm = {p: float(np.sqrt(sum(float((v ** 2).sum()) for v in rows[p].values()))) for p in rows}
        # The paper's per-path statistic: the mean over all the table's rows of the row's
        # gradient norm (a row no example touched counts 0).
        table_rows = {p: next(e["table"].shape[0] for k, e in paths.items() if k.endswith("/" + field)
                              and id(e["table"]) in tables[p]) for p in rows}
        mean_row = {p: float(sum(np.linalg.norm(v) for v in rows[p].values()) / table_rows[p]) for p in rows}
        entry = {"attention_norm": norm["attention"], "representation_norm": norm["representation"],
                 "attention_mean_row_norm": mean_row["attention"],
                 "representation_mean_row_norm": mean_row["representation"], "cosines": None, "rows": None}
        if tables["attention"] == tables["representation"]:
            common = sorted(set(rows["attention"]) & set(rows["representation"]))
            a = np.stack([rows["attention"][r] for r in common])
            b = np.stack([rows["representation"][r] for r in common])
            denominator = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            keep = denominator > 0
            entry["cosines"] = (a * b).sum(1)[keep] / denominator[keep]
            entry["rows"] = np.asarray(common)[keep]
        out[field] = entry
    return out


@public("dare_tf.analysis")
class SplitGradientRecorder(keras.callbacks.Callback):
    """A Keras callback for `model.fit`: at each of `steps`, before the step trains on
    its batch, records that batch's `path_statistics` (`split_gradients` of the
    current weights). It changes no weight: the model trains exactly as without it.

    Args:
        batch_at: `step -> (x, y)`, the batch `fit` trains on at that step.
        steps: the steps to record (`trajectory_steps` spreads them over a run).

    After `fit`, `samples` holds `{"step", "statistics"}` per record.
    """

    def __init__(self, batch_at, steps):
        super().__init__()
        self.batch_at, self.steps, self.samples = batch_at, set(int(s) for s in steps), []

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step in self.steps:
            x, y = self.batch_at(step)
            # The training-mode forward pass moves BatchNorm's statistics: put them back.
            state = [v.numpy() for v in self.model.non_trainable_variables]
            _, paths, _ = split_gradients(self.model, x, y)
            for variable, value in zip(self.model.non_trainable_variables, state):
                variable.assign(value)
            self.samples.append({"step": step, "statistics": path_statistics(paths)})


def trajectory_steps(total_steps: int, samples: int) -> list[int]:
    """`samples` steps at equal fractions of a run of `total_steps` (its first and
    last step included): the gradients are read over the whole trained
    trajectory, not only its first steps, where they are still collapsing."""
    return sorted({int(round(s)) for s in np.linspace(0, total_steps - 1, max(samples, 1))})


def summarize(samples: list[dict], field: str = "category", total_steps: int | None = None) -> dict:
    """Aggregates `path_statistics` samples of one field over a run of
    `total_steps`: per sampled step, its fraction of the run, the norm ratio
    (representation / attention) and the mean per-row cosine; `norm_ratio`, the
    median ratio over the trajectory, and `final_norm_ratio`, the last sample's;
    the share of sampled steps whose mean cosine is negative (the paper's
    conflict share); per row, the share of steps with a negative cosine."""
    steps = [s for s in samples if field in s["statistics"]]
    kept = [s for s in steps if s["statistics"][field]["attention_norm"] > 0]
    ratios = [s["statistics"][field]["representation_norm"] / s["statistics"][field]["attention_norm"] for s in kept]
    last = max(1, (total_steps or (max((s["step"] for s in steps), default=0) + 1)) - 1)
    out = {"field": field, "samples": len(steps), "steps": [s["step"] for s in kept],
           "fractions": [s["step"] / last for s in kept], "norm_ratios": ratios,
           "norm_ratio": float(np.median(ratios)) if ratios else float("nan"),
           "final_norm_ratio": float(ratios[-1]) if ratios else float("nan")}
    cosines = [s["statistics"][field]["cosines"] for s in steps]
    if steps and all(c is not None for c in cosines):
        means = [float(np.mean(c)) for c in cosines if len(c)]
        out["mean_cosines"] = means
        out["conflict_share"] = float(np.mean(np.array(means) < 0)) if means else float("nan")
        per_row: dict[int, list] = {}
        for s in steps:
            stats = s["statistics"][field]
            for row, c in zip(stats["rows"].tolist(), stats["cosines"].tolist()):
                per_row.setdefault(row, []).append(c)
        out["conflict_share_by_row"] = {int(r): float(np.mean(np.array(v) < 0)) for r, v in per_row.items()}
        out["row_cosine_counts"] = {int(r): len(v) for r, v in per_row.items()}
    else:
        out["mean_cosines"] = None
        out["conflict_share"] = None
    return out


# The paper's reading of the gradients (../shared/docs/reference.md): domination over its first
# 100 iterations; conflict over the run's iterations (here: every recorded one, `paper_steps`).
PAPER_FIRST_STEPS = 100
PAPER_CONFLICT_STEPS = 1000


def paper_steps(total_steps: int) -> list[int]:
    """The steps the paper's statistics read: the first `PAPER_FIRST_STEPS`, and up to
    `PAPER_CONFLICT_STEPS` spread evenly over the run (every step of a shorter one)."""
    spread = np.linspace(0, total_steps - 1, min(total_steps, PAPER_CONFLICT_STEPS)).round().astype(int)
    return sorted(set(range(min(total_steps, PAPER_FIRST_STEPS))) | set(spread.tolist()))


def summarize_paper(samples: list[dict], field: str = "category") -> dict:
    """The paper's statistics of `path_statistics` samples: `norm_ratio`, the
    representation path's mean row norm over the attention path's, each averaged
    over the samples of the first `PAPER_FIRST_STEPS` steps (the ratio of the two
    averages); `conflict_share`, the share of the samples whose mean per-row cosine
    is negative (None with decoupled tables); and how many samples each read."""
    steps = [s for s in samples if field in s["statistics"]]
    first = [s["statistics"][field] for s in steps if s["step"] < PAPER_FIRST_STEPS]
    attention = float(np.mean([f["attention_mean_row_norm"] for f in first])) if first else float("nan")
    representation = float(np.mean([f["representation_mean_row_norm"] for f in first])) if first else float("nan")
    means = [float(np.mean(s["statistics"][field]["cosines"])) for s in steps
             if s["statistics"][field]["cosines"] is not None and len(s["statistics"][field]["cosines"])]
    shared = bool(steps) and all(s["statistics"][field]["cosines"] is not None for s in steps)
    return {"norm_ratio": representation / attention if attention > 0 else float("nan"),
            "domination_steps": len(first), "conflict_steps": len(means),
            "conflict_share": float(np.mean(np.array(means) < 0)) if shared and means else None}


def gradient_analysis(data_dir: str, figures_dir: str, config, dim: int, max_len: int, report=print, train=None):
    """The suite's gradients analysis (`run_analyses`): each of `config.gradient_presets`
    (an `AnalysisConfig` or its dict) built at width `dim` and history length `max_len`, trained by
    its own `fit` on the training split (`train`, default loaded) with a `SplitGradientRecorder`;
    its figures written into `figures_dir`. Returns `{"result": ..., "figures": {name:
    path}}` (JSON: a process on another Keras backend asks one on TensorFlow's)."""
    from dare_tf.analysis import figures
    from dare_tf.analysis.config import AnalysisConfig
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.model.dare_model import DareModel
    from dare_tf.optimizers import make_optimizer
    from dare_tf.model.presets import make_config

    cfg = config if isinstance(config, AnalysisConfig) else AnalysisConfig(**{  # (lists: JSON's tuples)
        k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})
    spec = DatasetSpec.load(data_dir)
    train = train if train is not None else InMemorySplit.load(data_dir, "train", spec, max_len=max_len)
    summaries = {}
    for preset in cfg.gradient_presets:
        keras.utils.set_random_seed(cfg.seed)
        model = DareModel(make_config(preset, spec.num_items, spec.num_categories, max_len=max_len,
                                      embedding_dim=dim, top_k=min(20, max_len)),
                          seed=cfg.seed, jit_compile_dense=False)
        model.build()
        model.compile(optimizer=make_optimizer("adam", cfg.learning_rate))
        order = np.random.default_rng(cfg.seed).permutation(len(train))
        size = cfg.batch_size

        def batch_at(step, order=order, size=size):  # indexed per batch: no permuted copy of the split
            rows = order[step * size: (step + 1) * size]
            return {k: v[rows] for k, v in train.features.items()}, train.labels[rows]

        total = min(cfg.gradient_steps or len(order), -(-len(order) // size))
        trajectory = trajectory_steps(total, cfg.gradient_samples)
        recorder = SplitGradientRecorder(batch_at, sorted(set(trajectory) | set(paper_steps(total))))
        started = time.perf_counter()
        # The model's own fit (the trainer's loop), in the permutation's order.
        model.fit((batch_at(step) for step in range(total)), epochs=1, steps_per_epoch=total, shuffle=False,
                  verbose=0, callbacks=[recorder])
        # The package's statistics read the trajectory samples; the paper's, its own steps.
        samples = [s for s in recorder.samples if s["step"] in set(trajectory)]
        summaries[preset] = summarize(samples, total_steps=total)
        summaries[preset]["item"] = summarize(samples, "item", total)
        summaries[preset]["paper"] = summarize_paper(recorder.samples)
        summaries[preset].update(total_steps=total, coupling=model.model_config.coupling)
        report(f"  gradients of {preset}: {len(recorder.samples)} samples in {time.perf_counter() - started:.0f} s")
    written = {"gradients": figures.gradient_conflict(summaries, os.path.join(figures_dir, "gradient_conflict.png"))}
    headline = next((p for p in cfg.gradient_presets if summaries[p].get("conflict_share") is not None),
                    cfg.gradient_presets[0])
    top = summaries[headline]
    if top.get("conflict_share_by_row"):
        written["gradients_by_category"] = figures.conflict_by_category(
            top["conflict_share_by_row"], top["row_cosine_counts"], os.path.join(
                figures_dir, "gradient_conflict_by_category.png"), f"{headline}: gradient conflict per category")
    return {"result": {"model": headline, "norm_ratio": top["norm_ratio"], "paper": top["paper"],
                       "final_norm_ratio": top["final_norm_ratio"], "conflict_share": top.get("conflict_share"),
                       "by_model": summaries}, "figures": written}
