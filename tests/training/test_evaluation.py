"""Evaluation: BatchNorm statistics refreshed for the current weights, metrics by history length.
The test marked `engines` runs on JAX too (tests/training/test_engines.py)."""

import json
import os

import numpy as np
import pytest

from dare_tf.training import TrainConfig, train
from tests.training.common import FAST, TINY, files_held_open


@pytest.mark.slow
def test_batch_norm_statistics_refresh_fits_the_current_weights(planted, tmp_path):
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.feeding.pipeline import make_dataset
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.schema import MODEL_INPUTS
    from dare_tf.training import SeedRun

    data_dir, _ = planted
    spec = DatasetSpec.load(data_dir)

    def seed_run(name, **changes):
        config = TrainConfig.create(preset="twin", **dict(FAST, **changes))
        strategy = tf.distribute.get_strategy()
        return SeedRun(data_dir, str(tmp_path / name), config, 0, spec, strategy, True,
                       training.effective_model_config(config, spec, strategy), print)

    x, _ = next(iter(make_dataset(data_dir, "val", 512, shuffle=False)))
    x = {k: x[k] for k in MODEL_INPUTS}
    for name, changes, refreshes in (("on", {}, True), ("lazy_adam", dict(optimizer="lazy_adam"), True),
                                     ("reference", dict(reference_mode=True), False),
                                     ("off", dict(bn_statistics_batches=0), False)):
        run = seed_run(name, **changes)
        run.model.fit(run.plan.train_stream(0).take(40), verbose=0)  # some signal to calibrate
        norms = list(run.model.batch_norm_layers().values())
        assert len(norms) == 2
        for bn in norms:  # stale statistics, as after weights that moved fast
            bn.moving_mean.assign(bn.moving_mean + 1.0)
            bn.moving_variance.assign(bn.moving_variance * 4.0)
        stale = [bn.moving_mean.numpy().copy() for bn in norms]
        trainable = [w.numpy().copy() for w in run.model.trainable_weights]
        stale_p = run.model.forward(x, training=False)["probability"].numpy()
        run.evaluator.refresh_batch_norm_statistics()
        fresh_p = run.model.forward(x, training=False)["probability"].numpy()
        for w, before in zip(run.model.trainable_weights, trainable):
            np.testing.assert_array_equal(w.numpy(), before)  # no weight update
        if not refreshes:
            for bn, before in zip(norms, stale):
                np.testing.assert_array_equal(bn.moving_mean.numpy(), before)
            continue
        # An exact average over the same batches: what the statistics held before is gone.
        refreshed = [(bn.moving_mean.numpy(), bn.moving_variance.numpy()) for bn in norms]
        for bn in norms:
            bn.moving_mean.assign(bn.moving_mean - 7.0)
            bn.moving_variance.assign(bn.moving_variance * 0.01)
        run.evaluator.refresh_batch_norm_statistics()
        for bn, (mean, variance) in zip(norms, refreshed):
            np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-4, atol=1e-7)
        # The batch's own statistics (this call also moves the moving ones; it comes last).
        batch_p = run.model.forward(x, training=True)["probability"].numpy()
        stale_gap, fresh_gap = np.abs(stale_p - batch_p).mean(), np.abs(fresh_p - batch_p).mean()
        assert stale_gap > 0.05 and fresh_gap < stale_gap / 5, (stale_gap, fresh_gap)


def test_a_batch_norm_refresh_reads_at_most_the_steps_between_validations(planted, tmp_path, monkeypatch):
    """--bn_statistics_batches training batches, at most eval_every and the run's steps: a
    short run's refreshes read no more batches than it trained between two validations."""
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training import SeedRun
    from dare_tf.training.engines.tensorflow import evaluator

    data_dir, _ = planted
    spec = DatasetSpec.load(data_dir)
    read = []
    monkeypatch.setattr(evaluator, "refresh_batch_norm_statistics",
                        lambda model, batches, combine: read.append(sum(1 for _ in batches)))
    # (the planted log: an epoch of 113 steps at batch 256, validated every 22 by default)
    for changes, expected in ((dict(eval_every=4), 4), (dict(eval_every=4, bn_statistics_batches=3), 3),
                              (dict(eval_every=30), 30), (dict(eval_every=39, bn_statistics_batches=35), 35),
                              (dict(eval_every=100, max_steps=3), 3), (dict(eval_every=None), 22)):
        config = TrainConfig.create(preset="twin", **dict(FAST, **changes))
        strategy = tf.distribute.get_strategy()
        run = SeedRun(data_dir, str(tmp_path / str(len(read))), config, 0, spec, strategy, True,
                      training.effective_model_config(config, spec, strategy), print)
        assert run.plan.bn_statistics_batches == expected, changes
        run.evaluator.refresh_batch_norm_statistics()
        assert read[-1] == expected, changes


@pytest.mark.engines
def test_results_report_metrics_by_history_length_and_undertraining_warnings(planted, tmp_path):
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.run_directory import read_history
    from dare_tf.training import format_results, history_length_buckets
    from dare_tf.training.diagnostics import split_labels, undertraining_warnings

    assert [b[0] for b in history_length_buckets(200)] == ["1-9", "10-49", "50-199", "full"]
    assert [b[0] for b in history_length_buckets(30)] == ["1-9", "10-29", "full"]
    data_dir, _ = planted
    # The default schedule (no eval_every): a 10-step run validates 5 times.
    results = train(data_dir, str(tmp_path / "run"),
                    TrainConfig.create(preset="dare", **dict(TINY, eval_every=None, max_steps=10)))
    history = read_history(str(tmp_path / "run" / "seed_0"))
    assert [h["step"] for h in history] == [2, 4, 6, 8, 10]
    assert files_held_open(tmp_path / "run") == []  # (its TensorBoard event files closed)
    spec = DatasetSpec.load(data_dir)
    # Its warnings are the history's, recorded per seed and for the run, and printed
    # beneath the results table (the warnings themselves: tests/training/test_diagnostics.py).
    expected = undertraining_warnings(history, 10, *split_labels(spec, "val"))
    assert results["per_seed"][0]["warnings"] == expected and results["warnings"] == [f"seed 0: {w}" for w in expected]
    assert not any("fewer than 5" in w for w in expected)
    assert [line for line in format_results(results).splitlines() if line.startswith("warning: ")] == [
        f"warning: seed 0: {w}" for w in expected]
    buckets = results["test_by_history_length"]
    spec = json.load(open(os.path.join(data_dir, "spec.json")))
    assert sum(b["count"] for b in buckets.values()) == spec["counts"]["test"]
    for entry in buckets.values():
        assert set(entry) == {"count", "auc", "gauc", "category_auc", "logloss"}
    table = format_results(results)
    assert "| full |" in table and "| all |" in table


def test_curves_titles_do_not_repeat_the_preset():
    from dare_tf.analysis.figures import curves_title as _curves_title

    assert _curves_title("dare", "dare") == "dare"
    assert _curves_title("dare", "dare_10k") == "dare (dare_10k)"


def test_small_splits_are_evaluated_in_the_batch_that_holds_them(planted, tmp_path):
    """The in-memory splits' batch: the power of two that holds the largest of val and
    test, not `eval_batch_size` (8192 rows of padding took 1.6 GB at L=200); the
    predictions are those of the full-sized batch, each example's own."""
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training import SeedRun

    data_dir, _ = planted
    spec = DatasetSpec.load(data_dir)
    config = TrainConfig.create(preset="dare", **dict(FAST, eval_batch_size=8192))
    strategy = tf.distribute.get_strategy()
    model_config = training.effective_model_config(config, spec, strategy)
    memory = {s: InMemorySplit.load(data_dir, s, spec, model_config.max_len) for s in ("train", "val", "test")}
    run = SeedRun(data_dir, str(tmp_path / "run"), config, 0, spec, strategy, True, model_config, print,
                  memory=memory)
    largest = max(len(run.plan.memory["val"]), len(run.plan.memory["test"]))
    assert run.evaluator.memory_batch_size == 1 << (largest - 1).bit_length() < run.evaluator.batch_size
    small = run.evaluator.predict("val")
    run.evaluator.__class__ = type("FullBatch", (type(run.evaluator),), {"memory_batch_size": property(
        lambda self: self.batch_size)})
    full = run.evaluator.predict("val")
    assert small.keys() == full.keys() and all(len(v) == len(run.plan.memory["val"]) for v in small.values())
    for k in small:
        np.testing.assert_allclose(small[k], full[k], rtol=1e-5, atol=1e-6)
    reference = SeedRun(data_dir, str(tmp_path / "reference"), config.replace(reference_mode=True), 0, spec,
                        strategy, True, model_config, print, memory=memory)
    assert reference.evaluator.memory_batch_size == reference.evaluator.batch_size


def test_many_models_in_one_process_trace_without_tensorflows_retracing_warning():
    """Each model's graph function traces once; TensorFlow keyed its retracing count by the
    functions' shared code and warned after five models in one process (a program of many
    seeds, the test suite's programs): the functions are keyed by their own callables."""
    import logging

    import tensorflow as tf

    from dare_tf.model.presets import build_model
    from dare_tf.training.engines.tensorflow.prediction import _compiled

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        for _ in range(7):
            model = build_model("dare", num_items=20, num_categories=4, max_len=6, top_k=2)
            _compiled(model, "predict")(model.dummy_inputs(2))
    finally:
        tf.get_logger().removeHandler(handler)
    assert [m for m in said if "retracing" in m] == []


def test_predictions_and_batchnorm_moments_trace_the_model_once_for_every_batch_size(monkeypatch):
    """A split's partial last batch, or another split's batch size, calls the graph traced
    first (for any batch size): the model's forward traced once per function, the same
    probabilities as the model's own call."""
    import keras

    from dare_tf.model.dare_model import DareModel
    from dare_tf.model.presets import build_model
    from dare_tf.training.engines.tensorflow.prediction import _compiled

    model = build_model("dare", num_items=20, num_categories=4, max_len=6, top_k=2)
    forward, traced = DareModel.forward, []
    monkeypatch.setattr(DareModel, "forward", lambda self, *a, **k: traced.append(1) or forward(self, *a, **k))
    for what in ("predict", "moments"):
        calls = []
        for batch in (8, 8, 3, 5):
            x = model.dummy_inputs(batch)
            expected = keras.ops.convert_to_numpy(model(x, training=False))
            traced.clear()
            out = _compiled(model, what)(x)
            calls.append(len(traced))
            if what == "predict":
                np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
        assert calls == [1, 0, 0, 0], what


def test_a_metric_undefined_for_a_history_length_group_reads_n_a():
    """A group too small to hold both labels of a category (the demo on JAX with 600
    users: six examples aged 10-49) has no category AUC (NaN, written null in
    results.json): the table says n/a, where it raised TypeError, and a finished seed's
    result read back is summarized again (a run started again raised TypeError)."""
    from dare_tf.training import format_results
    from dare_tf.training.evaluation import summarize

    metrics = {"auc": 0.9, "gauc": 0.8, "category_auc": 0.7, "logloss": 0.4}
    results = {"test": metrics, "test_by_history_length": {
        "10-49": {"count": 6, **metrics, "category_auc": None}, "full": {"count": 1074, **metrics}}}
    assert format_results(results).splitlines()[2:] == [
        "| all |  | 0.9000 | 0.8000 | 0.7000 | 0.4000 |", "| 10-49 | 6 | 0.9000 | 0.8000 | n/a | 0.4000 |",
        "| full | 1,074 | 0.9000 | 0.8000 | 0.7000 | 0.4000 |"]
    seed = {"val": metrics, "test": dict(metrics, category_auc=None),
            "test_by_history_length": {"10-49": {"count": 6, **metrics, "category_auc": None}}}
    summary = summarize([seed])
    assert np.isnan(summary["test"]["category_auc"]) and summary["test"]["auc"] == 0.9
    assert np.isnan(summary["test_by_history_length"]["10-49"]["category_auc"])
    assert summary["test_by_history_length"]["10-49"]["logloss"] == 0.4
