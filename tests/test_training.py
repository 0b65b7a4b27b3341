import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from dare_tf.training import NonFiniteLossError, SeedRun, TrainConfig, train
from dare_tf.data.protocol import Protocol, prepare
from dare_tf.data.synthetic import SyntheticConfig, write

from tests.conftest import REPO, SHARED_DATA

TAOBAO = os.path.join(SHARED_DATA, "taobao", "UserBehavior_sample.csv")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A small planted log: 1,200 users, 60 categories, histories of 50."""
    root = tmp_path_factory.mktemp("planted")
    log = str(root / "log.csv")
    truth = write(SyntheticConfig(users=1200, items=3000, categories=60, min_length=80, max_length=160,
                                  seed=5), log)
    out = str(root / "prepared")
    prepare("taobao", log, out, Protocol(min_clicks=60, max_len=50, train_targets=8))
    return out, truth


# XLA is tested in tests/test_models.py; graph mode keeps these runs short.
FAST = dict(batch_size=256, eval_batch_size=512, epochs=1, eval_every=40, learning_rate=0.005,
            model_overrides=dict(top_k=10), jit_compile=False, verbose=0)


@pytest.mark.slow
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
    again = train(data_dir, str(tmp_path / "dare_again"), TrainConfig.create(preset="dare", **FAST))
    assert again["test"]["auc"] == pytest.approx(aucs["dare"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["eta", "sdim", "twin_v2"])
def test_remaining_baselines_learn_the_planted_log(planted, tmp_path, preset):
    data_dir, _ = planted
    results = train(data_dir, str(tmp_path / preset), TrainConfig.create(preset=preset, **FAST))
    assert results["test"]["auc"] > 0.7, results["test"]


@pytest.mark.slow
def test_real_taobao_sample_trains_with_finite_metrics(taobao, tmp_path):
    results = train(taobao, str(tmp_path / "run"), TrainConfig.create(
        preset="dare", batch_size=256, eval_batch_size=256, epochs=1, eval_every=10, max_steps=12,
        seeds=(0, 1), reference_mode=True, verbose=0))
    with open(tmp_path / "run" / "results.json") as f:
        on_disk = json.load(f)
    for key in ("auc", "gauc", "category_auc", "logloss"):
        assert np.isfinite(on_disk["test"][key]) and np.isfinite(on_disk["test_std"][key])
        assert [r["seed"] for r in on_disk["per_seed"]] == [0, 1]
    # Reference mode drops the last partial evaluation batch: 258 val examples, batch 256.
    assert results["per_seed"][0]["best_step"] in (10, 12)
    history = [json.loads(line) for line in open(tmp_path / "run" / "seed_0" / "history.jsonl")]
    assert [h["step"] for h in history] == [10, 12]


def test_nan_loss_stops_with_the_step(taobao, tmp_path):
    config = TrainConfig.create(preset="twin", batch_size=256, eval_batch_size=256, epochs=1, learning_rate=1e30,
                         max_steps=15, eval_every=100, model_overrides=dict(initializer="keras"), jit_compile=False,
                         verbose=0)
    with pytest.raises(NonFiniteLossError, match=r"training loss became (nan|inf) at step \d+ \(epoch 0, seed 0 of twin\)"):
        train(taobao, str(tmp_path / "nan"), config)


def _train_command(data_dir, out):
    return [sys.executable, "-m", "trainers.train", "--model=dare", f"--data_dir={data_dir}",
            f"--output_dir={out}", "--batch_size=128", "--eval_batch_size=512", "--epochs=2",
            "--eval_every=5", "--max_steps=30", "--top_k=10", "--nojit_compile", "--verbose=0"]


@pytest.mark.slow
def test_killed_run_resumes_without_lost_or_repeated_steps(taobao, tmp_path):
    out = str(tmp_path / "killed")
    proc = subprocess.Popen(_train_command(taobao, out), cwd=REPO, env=ENV,
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
    done = subprocess.run(_train_command(taobao, out), cwd=REPO, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in open(history)]
    # Evaluations every 5 steps, to max_steps 30.
    assert steps == [5, 10, 15, 20, 25, 30]
    # The resumed run ends where an uninterrupted run ends.
    clean = str(tmp_path / "clean")
    subprocess.run(_train_command(taobao, clean), cwd=REPO, env=ENV, check=True, capture_output=True)
    resumed = json.load(open(os.path.join(out, "results.json")))
    uninterrupted = json.load(open(os.path.join(clean, "results.json")))
    assert resumed["test"]["auc"] == pytest.approx(uninterrupted["test"]["auc"], abs=1e-4)


@pytest.mark.parametrize("in_memory_mb", [0, 4096])
def test_training_stream_resumes_at_any_step(taobao, in_memory_mb, tmp_path):
    """From step k the stream is the uninterrupted stream's tail (streamed from the
    shards and decoded in memory); in memory, every batch is full and each run of
    len(train) examples from an epoch start is a permutation of the split."""
    import tensorflow as tf

    from dare_tf.data.pipeline import InMemorySplit
    from dare_tf.data.spec import DatasetSpec
    from dare_tf.training import effective_model_config

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(batch_size=500, epochs=2, in_memory_mb=in_memory_mb, verbose=0, jit_compile=False)
    memory = {"train": InMemorySplit.load(taobao, "train", spec)} if in_memory_mb else {}
    strategy = tf.distribute.get_strategy()
    run = SeedRun(taobao, str(tmp_path), config, 3, spec, strategy, True,
                   effective_model_config(config, spec, strategy), print, memory)

    def targets(skip):
        return [(x["target_item"].numpy(), x["hist_items"].numpy()) for x, _ in run.train_stream(skip)]

    full = targets(0)
    assert len(full) == run.total_steps
    for skip in (1, run.steps_per_epoch, run.total_steps - 1):
        tail = targets(skip)
        assert len(tail) == len(full) - skip
        for a, b in zip(tail, full[skip:]):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    count = spec.counts["train"]
    if in_memory_mb:
        assert all(len(t[0]) == 500 for t in full)
        assert run.total_steps == 2 * count // 500
        rows = lambda items, hist: (lambda a: a[np.lexsort(a.T[::-1])])(  # noqa: E731
            np.concatenate([items[:, None], hist], axis=1))
        first_epoch = rows(np.concatenate([t[0] for t in full])[:count],
                           np.concatenate([t[1] for t in full])[:count])
        split = memory["train"].features
        np.testing.assert_array_equal(first_epoch, rows(split["target_item"], split["hist_items"]))
    else:
        assert run.total_steps == 2 * -(-count // 500)
        # Streamed: each epoch (its steps, the last batch partial) is the split, each example once.
        rows = lambda items, hist: (lambda a: a[np.lexsort(a.T[::-1])])(  # noqa: E731
            np.concatenate([items[:, None], hist], axis=1))
        split = InMemorySplit.load(taobao, "train", spec).features
        for epoch in (0, 1):
            batches = full[epoch * run.steps_per_epoch: (epoch + 1) * run.steps_per_epoch]
            np.testing.assert_array_equal(rows(np.concatenate([t[0] for t in batches]),
                                               np.concatenate([t[1] for t in batches])),
                                          rows(split["target_item"], split["hist_items"]))


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("in_memory_mb", [4096, 0])
def test_two_workers_read_their_own_partitions_and_evaluate_exactly(taobao, tmp_path, in_memory_mb):
    """Two local workers (MultiWorkerMirroredStrategy): disjoint users whose union is
    the split, the same steps, each store about half the clicks, identical weights,
    and test metrics (gathered from both) equal to one process evaluating those weights."""
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.spec import DatasetSpec
    from dare_tf.data.store import read_examples

    helper = os.path.join(REPO, "tests", "multiworker_helper.py")
    ports = [_free_port(), _free_port()]
    procs = []
    for index in (0, 1):
        tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}}
        procs.append(subprocess.Popen(
            [sys.executable, helper, "multi_worker", taobao, str(tmp_path / "multi"),
             str(tmp_path / f"w{index}.npz"), "12", "adam", str(in_memory_mb)],
            env=dict(ENV, TF_CONFIG=json.dumps(tf_config)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    info = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in (0, 1)]
    spec = DatasetSpec.load(taobao)
    assert info[0]["partitions"] == list(range(0, spec.partitions, 2))
    assert info[1]["partitions"] == list(range(1, spec.partitions, 2))
    users = [set(i["train_users"]) for i in info]
    assert not users[0] & users[1]
    assert users[0] | users[1] == set(read_examples(taobao, "train", spec)["uid"].tolist())
    assert info[0]["steps"] == info[1]["steps"] == 12 and info[0]["steps_per_epoch"] == info[1]["steps_per_epoch"]
    for i in info:
        assert 0.3 < i["store_clicks"] / spec.clicks_stored < 0.7
    assert info[0]["store_clicks"] + info[1]["store_clicks"] == spec.clicks_stored
    w0, w1 = (np.load(tmp_path / f"w{i}.npz") for i in (0, 1))
    for key in w0:
        np.testing.assert_array_equal(w0[key], w1[key])
    # One process, the same weights, the whole test split: the same metrics.
    config = TrainConfig.create(preset="dare", batch_size=258, eval_batch_size=258, jit_compile=False, verbose=0,
                         model_overrides=dict(initializer="keras", top_k=5))
    strategy = tf.distribute.get_strategy()
    run = SeedRun(taobao, str(tmp_path / "one"), config, 0, spec, strategy, True,
                  training.effective_model_config(config, spec, strategy), print)
    run.model.set_weights([w0[k] for k in w0])
    one = training.evaluate_outputs(run.predict("test"))
    for metric, value in one.items():
        assert info[0]["test"][metric] == pytest.approx(value, abs=1e-6), metric
        assert info[1]["test"][metric] == pytest.approx(value, abs=1e-6), metric
    assert os.path.exists(tmp_path / "multi" / "seed_0" / "checkpoints")


@pytest.mark.slow
def test_batch_norm_statistics_refresh_fits_the_current_weights(planted, tmp_path):
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.pipeline import make_dataset
    from dare_tf.data.spec import MODEL_INPUTS, DatasetSpec

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
        run.model.fit(run.train_stream(0).take(40), verbose=0)  # some signal to calibrate
        norms = list(run.model.batch_norm_layers().values())
        assert len(norms) == 2
        for bn in norms:  # stale statistics, as after weights that moved fast
            bn.moving_mean.assign(bn.moving_mean + 1.0)
            bn.moving_variance.assign(bn.moving_variance * 4.0)
        stale = [bn.moving_mean.numpy().copy() for bn in norms]
        trainable = [w.numpy().copy() for w in run.model.trainable_weights]
        stale_p = run.model.forward(x, training=False)["probability"].numpy()
        run.refresh_batch_norm_statistics()
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
        run.refresh_batch_norm_statistics()
        for bn, (mean, variance) in zip(norms, refreshed):
            np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-4, atol=1e-7)
        # The batch's own statistics (this call also moves the moving ones; it comes last).
        batch_p = run.model.forward(x, training=True)["probability"].numpy()
        stale_gap, fresh_gap = np.abs(stale_p - batch_p).mean(), np.abs(fresh_p - batch_p).mean()
        assert stale_gap > 0.05 and fresh_gap < stale_gap / 5, (stale_gap, fresh_gap)


# -- issue 10: a run directory never mixes configurations ---------------------------------------

TINY = dict(batch_size=256, eval_batch_size=1024, epochs=1, eval_every=5, max_steps=5, bn_statistics_batches=2,
            model_overrides=dict(top_k=5), verbose=0, jit_compile=False)


@pytest.mark.slow
def test_rerun_with_other_flags_is_refused_naming_the_fields(taobao, tmp_path):
    from dare_tf.training import RunConfigMismatchError

    out = str(tmp_path / "run")
    first = train(taobao, out, TrainConfig.create(preset="dare", **TINY))
    again = train(taobao, out, TrainConfig.create(preset="dare", **TINY))  # identical: reused
    assert again["test"] == first["test"]
    # The runtime section does not identify a run: another one reuses it.
    runtime = dict(verbose=2, log_every=7, steps_per_execution=5)
    assert train(taobao, out, TrainConfig.create(preset="dare", **dict(TINY, **runtime)), report=lambda s: None
                 )["test"] == first["test"]
    # A run recorded before a model field existed (hash_bits) matches that field's default.
    recorded = json.load(open(os.path.join(out, "run_config.json")))
    del recorded["model_config"]["hash_bits"]
    json.dump(recorded, open(os.path.join(out, "run_config.json"), "w"))
    assert train(taobao, out, TrainConfig.create(preset="dare", **TINY))["test"] == first["test"]
    with pytest.raises(RunConfigMismatchError, match="model_config.hash_bits: 32 in the run, 8 now"):
        train(taobao, out, TrainConfig.create(preset="dare", **dict(TINY, model_overrides=dict(
            TINY.get("model_overrides", {}), hash_bits=8))))
    before = open(os.path.join(out, "results.json")).read()
    changed = dict(TINY, learning_rate=0.02, model_overrides=dict(top_k=5, embedding_dim=8))
    with pytest.raises(RunConfigMismatchError) as err:
        train(taobao, out, TrainConfig.create(preset="twin", **changed))
    message = str(err.value)
    for field in ("train_config.preset: 'dare' in the run, 'twin' now",
                  "train_config.optimizer.learning_rate: 0.01 in the run, 0.02 now",
                  "model_config.embedding_dim: 16 in the run, 8 now", "model_config.coupling"):
        assert field in message, message
    assert open(os.path.join(out, "results.json")).read() == before  # untouched
    (tmp_path / "run" / "my_notes.txt").write_text("keep")
    result = train(taobao, out, TrainConfig.create(preset="twin", **changed), overwrite=True)
    assert result["config"]["preset"] == "twin"
    assert json.load(open(os.path.join(out, "run_config.json")))["model_config"]["embedding_dim"] == 8
    assert (tmp_path / "run" / "my_notes.txt").read_text() == "keep"


def test_another_dataset_in_the_same_run_dir_is_refused(taobao, planted, tmp_path):
    from dare_tf.training import RunConfigMismatchError

    out = str(tmp_path / "run")
    train(taobao, out, TrainConfig.create(preset="dare", **TINY))
    with pytest.raises(RunConfigMismatchError, match="dataset.fingerprint"):
        train(planted[0], out, TrainConfig.create(preset="dare", **TINY))


def test_results_report_metrics_by_history_length(planted, tmp_path):
    from dare_tf.training import format_results, history_length_buckets

    assert [b[0] for b in history_length_buckets(200)] == ["1-9", "10-49", "50-199", "full"]
    assert [b[0] for b in history_length_buckets(30)] == ["1-9", "10-29", "full"]
    data_dir, _ = planted
    results = train(data_dir, str(tmp_path / "run"), TrainConfig.create(preset="dare", **TINY))
    buckets = results["test_by_history_length"]
    spec = json.load(open(os.path.join(data_dir, "spec.json")))
    assert sum(b["count"] for b in buckets.values()) == spec["counts"]["test"]
    for entry in buckets.values():
        assert set(entry) == {"count", "auc", "gauc", "category_auc", "logloss"}
    table = format_results(results)
    assert "| full |" in table and "| all |" in table


@pytest.mark.slow
def test_trainer_command_line_errors_and_flag_file(taobao, tmp_path):
    out = str(tmp_path / "cli")
    base = [sys.executable, "-m", "trainers.train", f"--data_dir={taobao}", f"--output_dir={out}"]
    cases = [(["--learning_rate=-1"], 2, "--learning_rate=-1.0: must be a finite number > 0"),
             (["--top_k=500"], 1, "--top_k=500 is larger than the history length max_len=200"),
             (["--max_len=0"], 1, "--max_len: must be >= 1, got 0"),
             ([f"--data_dir={tmp_path}/nowhere"], 1, "spec.json not found")]
    for args, code, message in cases:
        result = subprocess.run(base + args, cwd=REPO, env=ENV, capture_output=True, text=True)
        assert result.returncode == code, (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and message in result.stderr.strip().splitlines()[-1], result.stderr
    help_text = subprocess.run([sys.executable, "-m", "trainers.train", "--help"], cwd=REPO, env=ENV,
                               capture_output=True, text=True).stdout
    for flag in ("--learning_rate", "--max_len", "--attention_embedding_dim", "--coupling", "--top_k", "--l2", "--mlp_units",
                 "--bn_statistics_batches", "--model", "--overwrite"):
        assert flag in help_text, flag
    done = subprocess.run(base + ["--flagfile=configs/smoke.flags", "--nojit_compile"], cwd=REPO, env=ENV,
                          capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    flags_txt = open(os.path.join(out, "flags.txt")).read()
    assert "--max_steps=3" in flags_txt and "--model=dare" in flags_txt


def test_keras_compile_fit_evaluate_give_the_trainers_loss_on_the_same_batch(taobao, tmp_path):
    """The README's Keras example and trainers.train compute one loss."""
    import keras
    import tensorflow as tf

    import dare_tf
    from dare_tf import training
    from dare_tf.data.pipeline import make_dataset
    from dare_tf.data.spec import MODEL_INPUTS, DatasetSpec

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


def test_train_config_sections_flat_names_and_identity():
    from dare_tf.training.config import DataConfig, OptimizerConfig, RuntimeConfig, ScheduleConfig

    config = TrainConfig.create(preset="twin", batch_size=64, optimizer="lazy_adam", in_memory_mb=0, verbose=0,
                                seeds=[3, 4])
    assert config.schedule == ScheduleConfig(batch_size=64) and config.optimizer == OptimizerConfig("lazy_adam")
    assert config.data == DataConfig(in_memory_mb=0) and config.runtime == RuntimeConfig(verbose=0)
    assert config.seeds == (3, 4) and TrainConfig.create(**config.flat()) == config
    assert config.replace(learning_rate=0.5).optimizer.learning_rate == 0.5
    identity = config.identity()
    assert "runtime" not in identity and identity["optimizer"] == {"name": "lazy_adam", "learning_rate": 0.01}
    with pytest.raises(TypeError, match="^TrainConfig.create: unknown field 'batchsize'$"):
        TrainConfig.create(batchsize=1)
    with pytest.raises(ValueError, match=r"^optimizer='sgd': must be one of \('adam', 'lazy_adam'\)$"):
        TrainConfig.create(optimizer="sgd")
    with pytest.raises(ValueError, match="^batch_size=0: must be >= 1$"):
        TrainConfig.create(batch_size=0)


def test_steps_per_execution_trains_the_same_run(taobao, tmp_path):
    assert TrainConfig.create(eval_every=150, steps_per_execution=10).execution_steps == 10
    assert TrainConfig.create(eval_every=33, steps_per_execution=10).execution_steps == 3  # validations 33 steps apart
    assert TrainConfig.create(eval_every=7, steps_per_execution=4).execution_steps == 1
    config = dict(TINY, eval_every=6, max_steps=12)
    one = train(taobao, str(tmp_path / "one"), TrainConfig.create(preset="dare", steps_per_execution=1, **config))
    six = train(taobao, str(tmp_path / "six"), TrainConfig.create(preset="dare", steps_per_execution=6, **config))
    assert one["per_seed"][0]["steps"] == six["per_seed"][0]["steps"] == 12
    assert one["test"] == six["test"] and one["val"] == six["val"]


def test_one_trainer_per_run_directory_and_a_killed_holders_lock_is_taken_over(taobao, tmp_path):
    """A second trainer on a run directory in use stops at once with one line naming
    the holder's pid (exit 1) and writes nothing; the lock of a killed holder is
    taken over."""
    from dare_tf.run_directory import LOCK, RunDirectory, RunLockedError

    out = tmp_path / "run"
    with RunDirectory(str(out)).lock():
        result = subprocess.run(_train_command(taobao, out), cwd=REPO, env=ENV, capture_output=True, text=True)
        assert result.returncode == 1, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"error: {out} is in use by another trainer (pid {os.getpid()}); wait for it to finish or choose "
            "another --output_dir")
        assert os.listdir(out) == [LOCK]
        with pytest.raises(RunLockedError):  # also within one process
            with RunDirectory(str(out)).lock():
                pass
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from dare_tf.run_directory import RunDirectory; "
                             "RunDirectory(sys.argv[1]).lock().__enter__(); os.kill(os.getpid(), 9)", str(out)],
                            cwd=REPO, env=ENV, capture_output=True, text=True)
    assert killed.returncode == -9
    assert (out / LOCK).read_text().strip() != str(os.getpid())  # the killed process's pid
    with RunDirectory(str(out)).lock():
        assert (out / LOCK).read_text().strip() == str(os.getpid())
