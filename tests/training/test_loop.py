"""The training loop end to end: learning, resuming, the program, Keras conventions.

The tests marked `engines` run on both engines: here on TensorFlow's, and on JAX's
in a process where TensorFlow cannot load (tests/training/test_engines.py), so this
module imports TensorFlow only inside the tests that are TensorFlow's alone."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dare_tf.training import TrainConfig, train
from tests.conftest import ENV, LOUD_ENV, REPO, noise
from tests.programs import run_program
from tests.training.common import (FAST, TINY, files_held_open, tensorboard_hparams, tensorboard_scalars,
                                   train_command)


@pytest.mark.slow
@pytest.mark.engines
def test_planted_log_dare_and_twin_learn_and_fixed_seed_reproduces(planted, tmp_path):
    data_dir, truth = planted
    # The generator's own next-click probability reaches this AUC on such a log.
    assert truth["generator_auc"] > 0.75
    aucs = {}
    for preset in ("dare", "twin"):
        results = train(data_dir, str(tmp_path / preset), TrainConfig.create(preset=preset, **FAST))
        aucs[preset] = results["test"]["auc"]
        assert all(np.isfinite(v) for v in results["test"].values())
    # Well above chance (0.5), in the range of the generator's own AUC.
    assert min(aucs.values()) > 0.7, aucs
    # A fixed seed reproduces the run (a short one: the same code path, fewer steps).
    short = dict(FAST, max_steps=10, eval_every=5)
    once, again = (train(data_dir, str(tmp_path / f"dare_short_{i}"), TrainConfig.create(preset="dare", **short))
                   for i in (0, 1))
    assert again["test"] == once["test"] and again["val"] == once["val"]


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("preset", ["eta", "sdim", "twin_v2"])
def test_remaining_baselines_learn_the_planted_log(planted, tmp_path, preset):
    data_dir, _ = planted
    results = train(data_dir, str(tmp_path / preset), TrainConfig.create(preset=preset, **FAST))
    assert results["test"]["auc"] > 0.7, results["test"]


@pytest.mark.slow
def test_real_taobao_sample_trains_with_finite_metrics(taobao, tmp_path):
    results = train(taobao, str(tmp_path / "run"), TrainConfig.create(
        preset="dare", batch_size=256, eval_batch_size=256, epochs=1, eval_every=10, max_steps=12,
        seeds=(0, 1), reference_mode=True, verbose=0, log_every=5))
    with open(tmp_path / "run" / "results.json") as f:  # standard JSON: a bare NaN is refused
        on_disk = json.load(f, parse_constant=lambda c: pytest.fail(f"results.json holds {c}"))
    for key in ("auc", "gauc", "category_auc", "logloss"):
        assert np.isfinite(on_disk["test"][key]) and np.isfinite(on_disk["test_std"][key])
        assert [r["seed"] for r in on_disk["per_seed"]] == [0, 1]
    # Reference mode drops the last partial evaluation batch: 258 val examples, batch 256.
    assert results["per_seed"][0]["best_step"] in (10, 12)
    history = [json.loads(line) for line in open(tmp_path / "run" / "seed_0" / "history.jsonl")]
    assert [h["step"] for h in history] == [10, 12]
    # TensorBoard: the training loss every log_every steps, the exact validation metrics at
    # every validation and the test metrics of the kept weights, at their true steps.
    board = tmp_path / "run" / "seed_0" / "tensorboard"
    assert [step for step, _ in tensorboard_scalars(board / "train")["loss"]] == [5, 10]
    validation = tensorboard_scalars(board / "validation")
    assert sorted(validation) == ["auc", "category_auc", "gauc", "logloss"]
    assert [step for step, _ in validation["auc"]] == [10, 12]
    assert [value for _, value in validation["auc"]] == pytest.approx([h["val"]["auc"] for h in history])
    (step, test_auc), = tensorboard_scalars(board / "test")["auc"]
    # stamped at the step whose weights were kept (the best validation), not the last one
    assert step == results["per_seed"][0]["best_step"] and test_auc == pytest.approx(
        results["per_seed"][0]["test"]["auc"])
    # The run's hyperparameters, for TensorBoard's HParams dashboard.
    hparams = tensorboard_hparams(board)
    assert hparams["model.coupling"].string_value == "decoupled"
    assert hparams["train.batch_size"].number_value == 256 and hparams["seed"].number_value == 0
    assert files_held_open(tmp_path / "run") == []  # (each seed's event files closed)


def test_a_process_without_tensorflow_writes_its_events_without_loading_it(tmp_path):
    """The JAX engine's TensorBoard events, where TensorFlow is installed: before, the
    tensorboard package's writer imported it (2.6 s of a 20-step JAX run's 8.5 s, and
    TensorFlow's start-up notices in a JAX run's output)."""
    script = ("import sys\nfrom dare_tf.tensorboard_events import ScalarWriters\n"
              f"with ScalarWriters({str(tmp_path)!r}) as writers:\n    writers.write('train', {{'loss': 0.5}}, 3)\n"
              "print([name for name in ('tensorflow', 'keras') if name in sys.modules])")
    done = subprocess.run([sys.executable, "-c", script], env=dict(LOUD_ENV, KERAS_BACKEND="jax"),
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")
    assert tensorboard_scalars(tmp_path / "train")["loss"] == [(3, 0.5)]


@pytest.mark.engines
def test_the_paper_schedule_on_a_small_log_warns_before_it_trains(taobao, tmp_path):
    """The Taobao sample's 4,902 training examples at the defaults (batch 2048, 2 epochs):
    4 steps. The trainer says so before training (and the run's warnings keep it)."""
    lines = []
    results = train(taobao, str(tmp_path / "run"), TrainConfig.create(preset="dare", jit_compile=False, verbose=0),
                    report=lines.append)
    warning = ("the schedule gives 4 training steps (4902 examples, batch 2048, 2 epochs; fewer than 50): too few "
               "to train a model; lower --batch_size (--batch_size=128: 76 steps) or raise --epochs")
    assert lines[0] == f"warning: {warning}"
    assert results["warnings"][0] == f"seed 0: {warning}"


@pytest.mark.slow
def test_killed_run_resumes_without_lost_or_repeated_steps(taobao, tmp_path, capsys):
    """Killed with -9 after its third validation, then its newest checkpoint's data cut
    short (issue 66, 3): the run names the damaged checkpoint, resumes from the older
    one kept beside it, and ends where an uninterrupted run ends."""
    import tensorflow as tf

    out = str(tmp_path / "killed")
    proc = subprocess.Popen(train_command(taobao, out), cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    history = os.path.join(out, "seed_0", "history.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline:
        if os.path.exists(history) and len(open(history).readlines()) >= 3:
            break
        if proc.poll() is not None:
            pytest.fail("training finished before it could be killed")
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(out, "results.json"))
    state = tf.train.get_checkpoint_state(os.path.join(out, "seed_0", "checkpoints"))
    *_, older, newest = state.all_model_checkpoint_paths
    data = newest + ".data-00000-of-00001"
    with open(data, "rb") as f:
        head = f.read(os.path.getsize(data) // 2)
    with open(data, "wb") as f:
        f.write(head)
    # Resumed in process with the configuration the flags make (another one would be
    # refused: tests/test_run_directory.py), then an uninterrupted run of it.
    config = TrainConfig.create(preset="dare", batch_size=128, eval_batch_size=512, epochs=2, eval_every=5,
                                max_steps=30, model_overrides=dict(top_k=10), jit_compile=False, verbose=0)
    resumed = train(taobao, out, config)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert said == [f"warning: {newest}: not a readable checkpoint (IndexError: Read less bytes than requested); "
                    f"resuming from the older {os.path.basename(older)}"]
    steps = [json.loads(line)["step"] for line in open(history)]
    # Evaluations every 5 steps, to max_steps 30.
    assert steps == [5, 10, 15, 20, 25, 30]
    # The resumed run ends where an uninterrupted run ends.
    uninterrupted = train(taobao, str(tmp_path / "clean"), config)
    assert resumed["test"]["auc"] == pytest.approx(uninterrupted["test"]["auc"], abs=1e-4)


@pytest.mark.parametrize("in_memory_mb", [0, 4096])
def test_training_stream_resumes_at_any_step(taobao, in_memory_mb, tmp_path):
    """From step k the stream is the uninterrupted stream's tail (streamed from the
    shards and decoded in memory); in memory, every batch is full and each run of
    len(train) examples from an epoch start is a permutation of the split."""
    import tensorflow as tf

    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training import SeedRun, effective_model_config

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(batch_size=500, epochs=2, in_memory_mb=in_memory_mb, verbose=0, jit_compile=False)
    memory = {"train": InMemorySplit.load(taobao, "train", spec)} if in_memory_mb else {}
    strategy = tf.distribute.get_strategy()
    run = SeedRun(taobao, str(tmp_path), config, 3, spec, strategy, True,
                   effective_model_config(config, spec, strategy), print, memory)

    def targets(skip):
        return [(x["target_item"].numpy(), x["hist_items"].numpy()) for x, _ in run.plan.train_stream(skip)]

    full = targets(0)
    assert len(full) == run.plan.total_steps
    for skip in (1, run.plan.steps_per_epoch, run.plan.total_steps - 1):
        tail = targets(skip)
        assert len(tail) == len(full) - skip
        for a, b in zip(tail, full[skip:]):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    count = spec.counts["train"]
    if in_memory_mb:
        assert all(len(t[0]) == 500 for t in full)
        assert run.plan.total_steps == 2 * count // 500
        rows = lambda items, hist: (lambda a: a[np.lexsort(a.T[::-1])])(  # noqa: E731
            np.concatenate([items[:, None], hist], axis=1))
        first_epoch = rows(np.concatenate([t[0] for t in full])[:count],
                           np.concatenate([t[1] for t in full])[:count])
        split = memory["train"].features
        np.testing.assert_array_equal(first_epoch, rows(split["target_item"], split["hist_items"]))
    else:
        assert run.plan.total_steps == 2 * -(-count // 500)
        # Streamed: each epoch (its steps, the last batch partial) is the split, each example once.
        rows = lambda items, hist: (lambda a: a[np.lexsort(a.T[::-1])])(  # noqa: E731
            np.concatenate([items[:, None], hist], axis=1))
        split = InMemorySplit.load(taobao, "train", spec).features
        for epoch in (0, 1):
            batches = full[epoch * run.plan.steps_per_epoch: (epoch + 1) * run.plan.steps_per_epoch]
            np.testing.assert_array_equal(rows(np.concatenate([t[0] for t in batches]),
                                               np.concatenate([t[1] for t in batches])),
                                          rows(split["target_item"], split["hist_items"]))


@pytest.mark.slow
def test_trainer_flag_file_reruns_the_run(taobao, tmp_path):
    out = str(tmp_path / "cli")
    base = [sys.executable, "-m", "trainers.train", f"--data_dir={taobao}", f"--output_dir={out}"]
    # Quiet by default (no TF_CPP_MIN_LOG_LEVEL from the environment): no TensorFlow C++ or absl
    # INFO lines, no retracing or serialization warnings.
    done = subprocess.run(base + ["--flagfile=configs/smoke.flags", "--nojit_compile"], cwd=REPO, env=LOUD_ENV,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not noise(done.stdout + done.stderr)
    # A deliberately short run (3 steps, one validation) says so beneath its table.
    assert ("\nwarning: seed 0: 1 validation (fewer than 5): too few to see convergence; validate more often "
            "(--eval_every) or train longer (--epochs)\n") in done.stdout
    assert json.load(open(os.path.join(out, "results.json")))["warnings"][0].startswith("seed 0: 1 validation")
    with open(os.path.join(out, "curves.png"), "rb") as f:  # the program draws the run's curves
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    flags_txt = open(os.path.join(out, "flags.txt")).read()
    assert "--max_steps=3" in flags_txt and "--model=dare" in flags_txt and "--nojit_compile" in flags_txt
    assert "--compilation_cache" not in flags_txt  # (JAX's: the engine that ran did not read it)
    lines = flags_txt.splitlines()
    assert all(line.startswith("--") for line in lines) and len(lines) == len(set(lines))
    for absl_own in ("--test_tmpdir", "--stderrthreshold", "--flagfile", "--overwrite", "--debug", "--helpfull"):
        assert absl_own not in flags_txt, absl_own
    # The flagfile reruns the same run, which is finished: reused as it is.
    results = open(os.path.join(out, "results.json")).read()
    again = run_program("trainers.train", f"--flagfile={out}/flags.txt")
    assert again.returncode == 0, again.stderr[-2000:]
    assert open(os.path.join(out, "results.json")).read() == results


def test_keras_compile_fit_evaluate_give_the_trainers_loss_on_the_same_batch(taobao, tmp_path):
    """The README's Keras example and trainers.train compute one loss."""
    import keras
    import tensorflow as tf

    import dare_tf
    from dare_tf import training
    from dare_tf.training import SeedRun
    from dare_tf.data.feeding.pipeline import make_dataset
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.schema import MODEL_INPUTS

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(preset="dare", **TINY)
    strategy = tf.distribute.get_strategy()
    run = SeedRun(taobao, str(tmp_path / "run"), config, 0, spec, strategy, True,
                  training.effective_model_config(config, spec, strategy), print)
    x, y = next(iter(make_dataset(taobao, "train", 256, shuffle=False)))
    x = {k: x[k].numpy() for k in MODEL_INPUTS}
    y = y.numpy()
    # The README's way: build, compile, evaluate / fit on the same batch, same weights.
    readme = dare_tf.build_model("dare", spec.num_items, spec.num_categories, max_len=spec.max_len, top_k=5,
                                 seed=0, jit_compile_dense=False)
    readme.set_weights(run.model.get_weights())
    readme.compile(optimizer=keras.optimizers.Adam(0.005))
    expected = run.model.loss_terms(y, run.model.forward(x, training=False))["total"]
    np.testing.assert_allclose(readme.evaluate(x, y, batch_size=256, verbose=0), float(expected), rtol=1e-5)
    trainer_eval = run.model.evaluate(x, y, batch_size=256, verbose=0, return_dict=True)
    np.testing.assert_allclose(trainer_eval["loss"], float(expected), rtol=1e-5)
    # One training step of each (BatchNorm in training mode): the loss before the update agrees.
    trainer_loss = run.model.train_on_batch(x, y, return_dict=True)["loss"]
    readme_loss = readme.train_on_batch(x, y)
    np.testing.assert_allclose(trainer_loss, readme_loss, rtol=1e-4)
    assert np.isfinite(trainer_loss) and trainer_loss > 0.5  # two cross entropies near log 2 each


@pytest.mark.engines
def test_steps_per_execution_trains_the_same_run(taobao, tmp_path):
    assert TrainConfig.create(steps_per_execution=10).execution_steps(150) == 10
    assert TrainConfig.create(steps_per_execution=10).execution_steps(33) == 3  # validations 33 steps apart
    assert TrainConfig.create(steps_per_execution=4).execution_steps(7) == 1
    config = dict(TINY, eval_every=6, max_steps=12)
    one = train(taobao, str(tmp_path / "one"), TrainConfig.create(preset="dare", steps_per_execution=1, **config))
    six = train(taobao, str(tmp_path / "six"), TrainConfig.create(preset="dare", steps_per_execution=6, **config))
    assert one["per_seed"][0]["steps"] == six["per_seed"][0]["steps"] == 12
    # The same steps on the same batches: equal on TensorFlow; on JAX the six steps are one
    # compiled program (a lax.scan) whose float sums XLA may order otherwise (measured: the
    # test log loss 5.6e-9 relative apart), far below what a lost or repeated step moves.
    for split in ("val", "test"):
        assert one[split] == pytest.approx(six[split], rel=1e-6, abs=0), split


def test_drawn_negatives_train_in_whole_groups_fresh_each_epoch(taobao, tmp_path):
    """--negatives: every epoch is each training click with freshly drawn negatives, in
    whole groups (click first), so the softmax loss sees one group per row; the run
    trains and reports the paper's metrics; what cannot be drawn is refused."""
    import tensorflow as tf

    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training import SeedRun, effective_model_config
    from dare_tf.training.reranking import Cascade

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(**dict(TINY, batch_size=240, epochs=2, max_steps=None, eval_every=1000),
                                negatives="popularity:2,category:3", loss="softmax")
    strategy = tf.distribute.get_strategy()
    model_config = effective_model_config(config, spec, strategy)
    memory = {s: InMemorySplit.load(taobao, s, spec) for s in ("train", "val")}
    cascade = Cascade.load(taobao, spec, config, model_config.max_len, None, memory)
    assert cascade.examples == {}  # no retrieval run: no cascade metrics
    run = SeedRun(taobao, str(tmp_path / "seed"), config, 0, spec, strategy, True, model_config, print, memory,
                  cascade)
    clicks = spec.counts["train"] // (1 + spec.protocol["negatives"])
    assert run.plan.memory["train"].per_epoch == clicks * 6 and run.plan.total_steps == 2 * clicks * 6 // 240
    batches = [(x["target_item"].numpy(), x["hist_items"].numpy(), y.numpy()) for x, y in run.plan.train_stream(0)]
    labels = np.concatenate([b[2] for b in batches]).reshape(-1, 6)
    assert (labels == np.eye(1, 6)).all()
    first = np.concatenate([b[0] for b in batches])[: clicks * 6].reshape(-1, 6)
    second = np.concatenate([b[0] for b in batches])[clicks * 6:].reshape(-1, 6)
    histories = np.concatenate([b[1] for b in batches]).reshape(-1, 6, model_config.max_len)
    assert (histories == histories[:, :1]).all()  # one history per group
    positives = memory["train"].columns["target_item"][memory["train"].labels > 0.5]
    assert sorted(first[:, 0]) == sorted(positives)
    assert not np.array_equal(np.sort(first, axis=1), np.sort(second[: len(first)], axis=1))  # drawn afresh
    results = train(taobao, str(tmp_path / "run"), config.replace(max_steps=6, eval_every=3))
    assert np.isfinite(results["test"]["auc"]) and "test_cascade" not in results
    with pytest.raises(ValueError, match=r"^--negatives=popularity:2,category:3 draws each epoch's negatives in "
                                         r"memory, but the train split of .* is larger than --in_memory_mb=0; raise "
                                         r"it \(20 bytes per example\)$"):
        train(taobao, str(tmp_path / "streamed"), config.replace(in_memory_mb=0))


@pytest.mark.parametrize("in_memory_mb", [0, 64])
def test_the_training_stream_builds_only_the_epochs_its_steps_reach(taobao, tmp_path, in_memory_mb, monkeypatch):
    """epochs=1,000,000 with max_steps=3: one epoch's order or dataset is made, not a
    million (which took a minute and 6 GB at epochs=1,000 on a 1M-row log)."""
    import tensorflow as tf

    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training import SeedRun, effective_model_config
    from dare_tf.training.engines.tensorflow.input import TensorFlowInput

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(batch_size=100, epochs=1_000_000, max_steps=3, in_memory_mb=in_memory_mb, verbose=0,
                                jit_compile=False)
    memory = {"train": InMemorySplit.load(taobao, "train", spec)} if in_memory_mb else {}
    made = []
    for name in ("_permutation", "epoch_batches"):
        original = getattr(TensorFlowInput, name)
        monkeypatch.setattr(TensorFlowInput, name, lambda self, epoch, *a, _o=original, **k: made.append(epoch) or _o(
            self, epoch, *a, **k))
    strategy = tf.distribute.get_strategy()
    run = SeedRun(taobao, str(tmp_path), config, 3, spec, strategy, True,
                  effective_model_config(config, spec, strategy), print, memory)
    made.clear()
    assert len(list(run.plan.train_stream(0))) == 3 and made == [0]
