import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from dare_tf.training import NonFiniteLossError, TrainConfig, train
from data.protocol import Protocol, prepare
from data.synthetic import SyntheticConfig, write

from tests.conftest import REPO, SHARED_DATA

TAOBAO = os.path.join(SHARED_DATA, "taobao", "UserBehavior_sample.csv")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)


@pytest.fixture(scope="module")
def taobao(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("prep") / "taobao")
    prepare("taobao", TAOBAO, out)
    return out


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


FAST = dict(batch_size=256, eval_batch_size=512, epochs=1, eval_every=40, learning_rate=0.005,
            model_overrides=dict(top_k=10))


def test_planted_log_dare_and_twin_learn_and_fixed_seed_reproduces(planted, tmp_path):
    data_dir, truth = planted
    # The generator's own next-click probability reaches this AUC on such a log.
    assert truth["generator_auc"] > 0.75
    aucs = {}
    for preset in ("dare", "twin"):
        results = train(data_dir, str(tmp_path / preset), TrainConfig(preset=preset, **FAST))
        aucs[preset] = results["test"]["auc"]
        assert all(np.isfinite(v) for v in results["test"].values())
    # Well above chance (0.5), in the range of the generator's own AUC.
    assert min(aucs.values()) > 0.7, aucs
    again = train(data_dir, str(tmp_path / "dare_again"), TrainConfig(preset="dare", **FAST))
    assert again["test"]["auc"] == pytest.approx(aucs["dare"], abs=1e-6)


def test_real_taobao_sample_trains_with_finite_metrics(taobao, tmp_path):
    results = train(taobao, str(tmp_path / "run"), TrainConfig(
        preset="dare", batch_size=256, eval_batch_size=256, epochs=1, eval_every=10, max_steps=12,
        seeds=(0, 1), reference_mode=True))
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
    config = TrainConfig(preset="twin", batch_size=256, eval_batch_size=256, epochs=1, learning_rate=1e30,
                         max_steps=15, eval_every=100, model_overrides=dict(initializer="keras"))
    with pytest.raises(NonFiniteLossError, match=r"training loss became (nan|inf) at step \d+ \(epoch 0, seed 0\)"):
        train(taobao, str(tmp_path / "nan"), config)


def _train_command(data_dir, out):
    return [sys.executable, "-m", "trainers.train", "--model=dare", f"--data_dir={data_dir}",
            f"--output_dir={out}", "--batch_size=128", "--eval_batch_size=512", "--epochs=2",
            "--eval_every=5", "--max_steps=30", "--top_k=10"]


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
    # 4,902 examples / 128 = 39 steps per epoch; evaluations every 5 steps, to step 30.
    assert steps == [5, 10, 15, 20, 25, 30]
    # The resumed run ends where an uninterrupted run ends.
    clean = str(tmp_path / "clean")
    subprocess.run(_train_command(taobao, clean), cwd=REPO, env=ENV, check=True, capture_output=True)
    resumed = json.load(open(os.path.join(out, "results.json")))
    uninterrupted = json.load(open(os.path.join(clean, "results.json")))
    assert resumed["test"]["auc"] == pytest.approx(uninterrupted["test"]["auc"], abs=1e-4)


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_workers_train_identically_and_match_one_process(taobao, tmp_path):
    helper = os.path.join(REPO, "tests", "multiworker_helper.py")
    single = subprocess.run([sys.executable, helper, "default", taobao, str(tmp_path / "single"),
                             str(tmp_path / "single.npz"), "2"], env=ENV, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-3000:]
    ports = [_free_port(), _free_port()]
    procs = []
    for index in (0, 1):
        tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}}
        procs.append(subprocess.Popen(
            [sys.executable, helper, "multi_worker", taobao, str(tmp_path / "multi"),
             str(tmp_path / f"w{index}.npz"), "2"],
            env=dict(ENV, TF_CONFIG=json.dumps(tf_config)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    w0, w1, one = (np.load(tmp_path / f"{n}.npz") for n in ("w0", "w1", "single"))
    for key in w0:
        np.testing.assert_array_equal(w0[key], w1[key])
        # Adam divides by |gradient|: for near-zero gradients, float reordering of
        # the all-reduce moves a weight by a small fraction of the 0.01 step.
        np.testing.assert_allclose(w0[key], one[key], atol=2e-3)
    assert os.path.exists(tmp_path / "multi" / "seed_0" / "checkpoints")


def test_batch_norm_statistics_refresh_fits_the_current_weights(planted, tmp_path):
    import keras
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.input_pipeline import make_dataset
    from dare_tf.models import INPUT_KEYS
    from dare_tf.spec import DatasetSpec

    data_dir, _ = planted

    def seed_run(name, **changes):
        config = TrainConfig(preset="twin", **dict(FAST, **changes))
        return training._SeedRun(data_dir, str(tmp_path / name), config, 0, DatasetSpec.load(data_dir),
                                 tf.distribute.get_strategy(), True)

    x, _ = next(iter(make_dataset(data_dir, "val", 512, shuffle=False)))
    x = {k: x[k] for k in INPUT_KEYS}
    for name, changes, refreshes in (("on", {}, True), ("lazy_adam", dict(optimizer="lazy_adam"), True),
                                     ("reference", dict(reference_mode=True), False),
                                     ("off", dict(bn_statistics_batches=0), False)):
        run = seed_run(name, **changes)
        for step, (batch, labels) in enumerate(run._epoch_dataset(0, 0)):  # some signal to calibrate
            run.train_step({k: batch[k] for k in INPUT_KEYS}, labels)
            if step == 40:
                break
        norms = [layer for layer in run.model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
        assert norms
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
