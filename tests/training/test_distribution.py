"""Several workers: their own partitions, the same steps, exact gathered evaluation."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from dare_tf.training import SeedRun, TrainConfig
from tests.conftest import REPO
from tests.conftest import ENV


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_workers_read_their_own_partitions_and_evaluate_exactly(taobao, tmp_path):
    """Two local workers (MultiWorkerMirroredStrategy): disjoint users whose union is
    the split, the same steps, each store about half the clicks, identical weights,
    and test metrics (gathered from both) equal to one process evaluating those weights.
    Both input paths, in memory and streamed, trained in turn by the same two workers."""
    helper = os.path.join(REPO, "tests", "multiworker_helper.py")
    ports = [_free_port(), _free_port()]
    procs = []
    for index in (0, 1):
        tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}}
        procs.append(subprocess.Popen(
            [sys.executable, helper, "multi_worker", taobao, str(tmp_path / "multi"),
             str(tmp_path / f"w{index}.npz"), "12", "adam", "4096,0"],
            env=dict(ENV, TF_CONFIG=json.dumps(tf_config)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    for in_memory_mb in (4096, 0):
        _check_two_workers(taobao, tmp_path, in_memory_mb)


def _check_two_workers(taobao, tmp_path, in_memory_mb):
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.spec import DatasetSpec
    from dare_tf.data.store import read_examples

    info = [json.loads((tmp_path / f"w{i}.{in_memory_mb}.json").read_text()) for i in (0, 1)]
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
    w0, w1 = (np.load(tmp_path / f"w{i}.{in_memory_mb}.npz") for i in (0, 1))
    for key in w0:
        np.testing.assert_array_equal(w0[key], w1[key])
    # One process, the same weights, the whole test split: the same metrics.
    config = TrainConfig.create(preset="dare", batch_size=258, eval_batch_size=258, jit_compile=False, verbose=0,
                         model_overrides=dict(initializer="keras", top_k=5))
    strategy = tf.distribute.get_strategy()
    run = SeedRun(taobao, str(tmp_path / f"one{in_memory_mb}"), config, 0, spec, strategy, True,
                  training.effective_model_config(config, spec, strategy), print)
    run.model.set_weights([w0[k] for k in w0])
    one = training.evaluate_outputs(run.predict("test"))
    for metric, value in one.items():
        assert info[0]["test"][metric] == pytest.approx(value, abs=1e-6), metric
        assert info[1]["test"][metric] == pytest.approx(value, abs=1e-6), metric
    assert os.path.exists(tmp_path / "multi" / str(in_memory_mb) / "seed_0" / "checkpoints")
