"""Continuing from an earlier run (`--init_from`) on a dataset whose vocabularies grew:
old ids score as before, the start is recorded, a short continuation reaches a full
retrain's test AUC, and what cannot be continued is refused in one line.

The tests marked `engines` run on both engines: here on TensorFlow's, and on JAX's in
a process where TensorFlow cannot load (tests/training/test_engines.py), so this module
imports neither library."""

import dataclasses
import json
import os
import types

import numpy as np
import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.training import TrainConfig, train
from dare_tf.training.config import effective_model_config
from dare_tf.training.continuation import Continuation, ContinuationError
from tests.conftest import TAOBAO_LOG as TAOBAO
from tests.programs import run_program

DAY = 86_400
BY_DAY = Protocol(split="time", min_clicks=50, partitions=2, max_len=50)
RUN = dict(preset="dare", batch_size=512, eval_batch_size=4096, epochs=1, eval_every=100, verbose=0,
           jit_compile=False, model_overrides=dict(top_k=10))
# The module's tests share the run on the early days (`days`): one xdist worker runs them all.
pytestmark = pytest.mark.xdist_group("continuation")


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """The Taobao sample split by time: its days before the last (`early`), and all
    of them (`full`: a copy of `early` with the last day appended), and a run on the
    early days."""
    import shutil

    from dare_tf.data.preparation.append import append

    root = tmp_path_factory.mktemp("days")
    last_day = max(int(line.rsplit(",", 1)[1]) for line in open(TAOBAO)) // DAY * DAY
    with open(TAOBAO) as f, open(root / "early.csv", "w") as out, open(root / "last.csv", "w") as last:
        for line in f:
            (out if int(line.rsplit(",", 1)[1]) < last_day else last).write(line)
    early, full = str(root / "early"), str(root / "full")
    prepare("taobao", str(root / "early.csv"), early, BY_DAY)
    append(str(root / "last.csv"), shutil.copytree(early, full))
    run = str(root / "run_early")
    train(early, run, TrainConfig.create(**RUN))
    return types.SimpleNamespace(root=root, early=early, full=full, run=run)


@pytest.mark.engines
def test_a_grown_model_scores_old_ids_as_the_earlier_run_before_any_step(days):
    """The model a continued run builds (its tables at the grown vocabularies, its optimizer
    built, as each engine's seed run builds it), grown from the earlier run: the old rows
    and their Adam moments copied, the new rows the fresh draw's."""
    import keras

    from dare_tf import DareModel
    from dare_tf.run_directory import RunDirectory

    spec = DatasetSpec.load(days.full)
    config = TrainConfig.create(**RUN, init_from=days.run)
    model_config = effective_model_config(config, spec, None)  # (one device, on either engine)
    earlier_spec = DatasetSpec.load(days.early)
    assert model_config.num_items > earlier_spec.num_items  # the last day brought new items
    continuation = Continuation.load(days.run, "dare", model_config, days.full)
    model = DareModel(model_config, seed=0, name="dare")
    model.build()
    model.compile(optimizer=keras.optimizers.Adam(config.optimizer.learning_rate))
    model.optimizer.build(model.trainable_variables)
    fresh = {w.path: np.asarray(w).copy() for w in model.weights}
    continuation.grow_into(model)
    earlier = RunDirectory(days.run).load_model()
    test = InMemorySplit.load(days.early, "test", earlier_spec, max_len=model_config.max_len)
    x = {k: v[:512] for k, v in test.features.items()}
    np.testing.assert_allclose(model.predict_on_batch(x), earlier.predict_on_batch(x), atol=1e-6)
    old, new = earlier_spec.num_items, spec.num_items
    for source, target in zip(earlier.weights, model.weights):
        if "item_embedding" in target.path:
            grown = np.asarray(target)
            np.testing.assert_array_equal(grown[: old - 1], np.asarray(source)[: old - 1])
            np.testing.assert_array_equal(grown[-1], np.asarray(source)[old - 1])  # out-of-vocabulary row
            np.testing.assert_array_equal(grown[old - 1: new - 1], fresh[target.path][old - 1: new - 1])
    slots = [v for v in model.optimizer.variables if v.path.endswith("item_embedding_momentum")]
    assert slots and int(np.asarray(model.optimizer.iterations)) == 0
    source_slots = {v.path.split("/", 1)[1]: v for v in earlier.optimizer.variables}
    for slot in slots:
        kept = np.asarray(source_slots[slot.path.split("/", 1)[1]])
        np.testing.assert_array_equal(np.asarray(slot)[: old - 1], kept[: old - 1])


@pytest.mark.slow
@pytest.mark.engines
def test_a_short_continuation_reaches_a_full_retrains_auc_and_records_its_start(days, tmp_path):
    retrain = train(days.full, str(tmp_path / "retrain"), TrainConfig.create(**RUN))
    steps = retrain["per_seed"][0]["steps"] // 8
    continued = train(days.full, str(tmp_path / "continued"),
                      TrainConfig.create(**{**RUN, "eval_every": steps // 2}, init_from=days.run, max_steps=steps))
    report = {"retrain": (retrain["per_seed"][0]["steps"], retrain["test"]["auc"]),
              "continued": (continued["per_seed"][0]["steps"], continued["test"]["auc"])}
    print(report)  # (steps, test AUC) of each: `pytest -s` shows them
    assert continued["test"]["auc"] >= retrain["test"]["auc"] - 0.005, report
    recorded = json.load(open(tmp_path / "continued" / "run_config.json"))
    assert recorded["init_from"] == {"run_dir": os.path.abspath(days.run),
                                     "dataset_fingerprint": DatasetSpec.load(days.early).fingerprint()}
    assert recorded["train_config"]["init_from"] == os.path.abspath(days.run)


@pytest.mark.engines
def test_what_cannot_be_continued_is_refused_in_one_line(days, taobao, tmp_path):
    spec = DatasetSpec.load(days.full)
    config = effective_model_config(TrainConfig.create(**RUN), spec, None)  # (one device, on either engine)
    flag = f"--init_from={days.run}"
    cases = [
        (("twin", config, days.full), f"{flag} is a run of preset 'dare'; this run trains 'twin'"),
        (("dare", dataclasses.replace(config, top_k=5), days.full),
         f"{flag}: its model has top_k=10, this run 5; a continued model keeps every setting but the "
         "vocabularies"),
        (("dare", dataclasses.replace(config, num_items=DatasetSpec.load(taobao).num_items,
                                      num_categories=DatasetSpec.load(taobao).num_categories), taobao),
         f"{flag}: raw item "),
    ]
    for (preset, model_config, data_dir), message in cases:
        with pytest.raises(ContinuationError) as refused:
            Continuation.load(days.run, preset, model_config, data_dir)
        assert str(refused.value).startswith(message) and "\n" not in str(refused.value), str(refused.value)
    assert "in this one; the id maps must extend the earlier ones" in str(refused.value)
    with pytest.raises(ContinuationError, match=f"^--init_from: {tmp_path}: {tmp_path}/run_config.json not found; "
                                                "is it a finished run of python -m trainers.train"):
        Continuation.load(str(tmp_path), "dare", config, days.full)
    # The program: one line, nothing trained.
    done = run_program("trainers.train", "--model=twin", f"--data_dir={days.full}", f"--output_dir={tmp_path / 'twin'}",
                       f"--init_from={days.run}", "--verbose=0")
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: {flag} is a run of preset 'dare'; this run trains 'twin'"], done.stderr[-2000:]
