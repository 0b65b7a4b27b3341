"""Predictions on Keras's TensorFlow backend: a model's probabilities over a
split or any batches, and BatchNorm's statistics refreshed for the current
weights, each through one graph function traced once per model (the metrics
computed from them: `dare_tf.training.evaluation`)."""

from __future__ import annotations

import functools
import weakref

import numpy as np
import tensorflow as tf

from dare_tf._faces import public
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.schema import HIST_ITEMS, TARGET_CATEGORY, USER
from dare_tf.model.dare_model import DareModel
from dare_tf.model.inputs import input_keys


# Each model's traced functions, dropped with the model.
_FUNCTIONS: "weakref.WeakKeyDictionary[DareModel, dict]" = weakref.WeakKeyDictionary()


def _compiled(model: DareModel, what: str, training: bool = False):
    """The model's graph function for `predict` (probabilities of a feature dict) or
    `moments` (the mean and variance over the batch of each BatchNorm layer's input),
    traced once per model."""

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


