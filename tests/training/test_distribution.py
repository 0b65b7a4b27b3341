"""Several workers: their own partitions, the same steps, exact gathered evaluation."""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from dare_tf.training import SeedRun, TrainConfig
from dare_tf.testing.ports import free_port
from tests.conftest import REPO
from tests.conftest import ENV, LOUD_ENV


@pytest.mark.slow
def test_two_workers_read_their_own_partitions_and_evaluate_exactly(taobao, tmp_path):
    """Two local workers (MultiWorkerMirroredStrategy): disjoint users whose union is
    the split, the same steps, each store about half the clicks, identical weights,
    and test metrics (gathered from both) equal to one process evaluating those weights.
    Both input paths, in memory and streamed, trained in turn by the same two workers."""
    helper = os.path.join(REPO, "tests", "multiworker_helper.py")
    for attempt in range(2):
        shutil.rmtree(tmp_path / "multi", ignore_errors=True)  # (an aborted first attempt's)
        ports = [free_port(), free_port()]
        procs = []
        for index in (0, 1):
            tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                         "task": {"type": "worker", "index": index}}
            procs.append(subprocess.Popen(
                [sys.executable, helper, "multi_worker", taobao, str(tmp_path / "multi"),
                 str(tmp_path / f"w{index}.npz"), "12", "adam", "4096,0"],
                env=dict(ENV, TF_CONFIG=json.dumps(tf_config)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        errors = []
        for p in procs:  # (a peer whose partner aborted ends with the cluster error: both are waited for)
            try:
                errors.append(p.communicate(timeout=300)[1])
            except subprocess.TimeoutExpired:
                p.kill()
                errors.append(p.communicate()[1])
        aborted = any(_grpc_aborted(p.returncode, e) for p, e in zip(procs, errors))
        if not (aborted and attempt == 0):
            break
    for p, err in zip(procs, errors):
        assert p.returncode == 0, err[-3000:]
    for in_memory_mb in (4096, 0):
        _check_two_workers(taobao, tmp_path, in_memory_mb)


def _check_two_workers(taobao, tmp_path, in_memory_mb):
    import tensorflow as tf

    from dare_tf import training
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.store import read_examples

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
    one = training.evaluate_outputs(run.evaluator.predict("test"))
    for metric, value in one.items():
        assert info[0]["test"][metric] == pytest.approx(value, abs=1e-6), metric
        assert info[1]["test"][metric] == pytest.approx(value, abs=1e-6), metric
    assert os.path.exists(tmp_path / "multi" / str(in_memory_mb) / "seed_0" / "checkpoints")


def _worker(ports, index, data_dir, output_dir, *flags):
    """`python -m trainers.train` as task `index` of a cluster of workers on `ports`
    (SIGINT as a terminal delivers it, whatever the test runner set)."""
    import signal

    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
    return subprocess.Popen(
        [sys.executable, "-m", "trainers.train", "--strategy=multi_worker", f"--data_dir={data_dir}",
         f"--output_dir={output_dir}", "--nojit_compile", "--verbose=0", "--seeds=0", *flags],
        cwd=REPO, env=dict(LOUD_ENV, TF_CONFIG=json.dumps(tf_config), PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_listening(port, proc, seconds=120) -> str | None:
    """Until the task's server accepts connections (it is then waiting for its
    peers): None; or the stderr of a task that ended before (see `_grpc_aborted`)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("localhost", port)) == 0:
                return None
        time.sleep(0.2)
    err = proc.communicate()[1]
    assert proc.returncode is not None, f"task on port {port} never listened: {err[-2000:]}"
    return err


def _grpc_aborted(returncode, err: str) -> bool:
    """Whether a task met TensorFlow's gRPC poller fault (`epoll_wait error: Bad file
    descriptor`), as it did a few times on a loaded machine: it died of it
    (SIGABRT; `trainers.train` filters the line itself out with the runtime's other
    notices, `dare_tf._startup`), or its C++ runtime printed that line beside the
    helper's own. That fault, and only it, is tried once more by the tests below."""
    import signal

    return returncode == -signal.SIGABRT or "epoll_wait error: Bad file descriptor" in err


@pytest.mark.slow
def test_a_missing_peer_ends_the_wait_in_one_line_and_signals_end_it_at_once(taobao, tmp_path):
    """TensorFlow waits for a cluster's tasks for good, swallowing SIGTERM (its
    preemption notifier) and with Python unable to run its SIGINT handler: the
    trainer bounds the wait (--join_timeout_s) and honours both signals."""
    import signal

    for attempt in range(2):
        ports = [free_port(), free_port()]
        proc = _worker(ports, 0, taobao, tmp_path / "run", "--join_timeout_s=5")
        _, err = proc.communicate(timeout=180)
        if not (_grpc_aborted(proc.returncode, err) and attempt == 0):
            break
    assert proc.returncode == 1, err[-3000:]
    assert err.strip().splitlines() == [
        f"error: strategy=multi_worker: not every task of TF_CONFIG's cluster (worker:0=localhost:{ports[0]}, "
        f"worker:1=localhost:{ports[1]}) started within --join_timeout_s=5 s; start them all (each with its own "
        "task index)"], err[-3000:]
    assert not os.path.exists(tmp_path / "run")  # nothing was written
    for sig, code, last in ((signal.SIGTERM, -signal.SIGTERM, None),
                            (signal.SIGINT, 130, "error: interrupted while waiting for the multi-worker cluster")):
        for attempt in range(2):
            ports = [free_port(), free_port()]
            proc = _worker(ports, 0, taobao, tmp_path / "run")
            err = _wait_listening(ports[0], proc)
            if err is None:
                proc.send_signal(sig)
                _, err = proc.communicate(timeout=30)
            if not (_grpc_aborted(proc.returncode, err) and attempt == 0):
                break
        assert proc.returncode == code, err[-3000:]
        if last:
            assert err.strip().splitlines()[-1] == last, err[-3000:]


@pytest.mark.slow
def test_a_killed_peer_ends_the_other_task_in_one_line(taobao, tmp_path):
    import time

    for attempt in range(2):
        ports, runs = [free_port(), free_port()], tmp_path / f"attempt{attempt}"
        procs = [_worker(ports, i, taobao, runs / f"run{i}", "--epochs=500", "--batch_size=258", "--eval_every=10")
                 for i in (0, 1)]
        history = runs / "run0" / "seed_0" / "history.jsonl"
        deadline, died = time.monotonic() + 240, None
        while not (history.exists() and history.read_text().strip()) and time.monotonic() < deadline and not died:
            died = next((p for p in procs if p.poll() is not None), None)
            time.sleep(0.5)
        if died is None:
            break
        err = died.communicate()[1]
        for proc in procs:
            proc.kill()
            proc.communicate()
        assert _grpc_aborted(died.returncode, err) and attempt == 0, err[-3000:]
    assert history.exists() and history.read_text().strip(), "no validation within 240 s"
    procs[1].kill()
    _, err = procs[0].communicate(timeout=120)
    procs[1].communicate()
    assert procs[0].returncode == 1, err[-3000:]
    assert err.strip().splitlines() == [
        "error: --strategy=multi_worker: task /job:worker/replica:0/task:1 went away (UnavailableError); restart "
        "every task with the same flags: the run resumes from its last checkpoint"], err[-3000:]
    assert (runs / "run0" / "seed_0" / "checkpoints").exists()  # the finished work stays
    # The killed task may end before its own checkpoint of the step is written (each task keeps its
    # own, and a task killed early has not made its folder yet): made certain here, its checkpoints
    # removed where it wrote any (a fresh clone on 4 workers: none yet). Started again with the same flags, both
    # tasks resume at the newest step both hold, here the start, task 0 saying so (before, each
    # resumed at its own newest, and the collectives paired steps of different weights silently).
    newest = max(int(p.name[len("ckpt-"):-len(".index")]) for p in (runs / "run0" / "seed_0" / "checkpoints").glob(
        "ckpt-*.index"))
    killed_own = runs / "run1" / "seed_0" / ".worker-1" / "checkpoints"
    if killed_own.exists():
        shutil.rmtree(killed_own)
    warning = (f"warning: {runs}/run0/seed_0/checkpoints/ckpt-{newest}: not every process of the run holds step "
               f"{newest} (one ended before writing it); resuming from the start")
    for attempt in range(2):
        ports = [free_port(), free_port()]
        procs = [_worker(ports, i, taobao, runs / f"run{i}", "--epochs=500", "--batch_size=258", "--eval_every=10")
                 for i in (0, 1)]
        said, errors = _first_line_starting(procs, "warning:", seconds=240)
        if said is not None or not any(_grpc_aborted(p.returncode, e) for p, e in zip(procs, errors)) or attempt:
            break
    assert said == warning, (said, errors[0][-3000:])


def _first_line_starting(procs, prefix: str, seconds: float) -> tuple[str | None, list[str]]:
    """The first line of the first process's stdout that starts with `prefix`, read as
    it is printed (None: it ended, or `seconds` passed, before one); then every process
    killed, and their stderr."""
    import queue
    import threading

    lines, errors = queue.Queue(), [[] for _ in procs]
    readers = [threading.Thread(target=lambda: [lines.put(line) for line in procs[0].stdout] + [lines.put(None)])]
    readers += [threading.Thread(target=lambda p=p, e=e: e.extend(p.stderr)) for p, e in zip(procs, errors)]
    readers += [threading.Thread(target=lambda p=p: p.stdout.read()) for p in procs[1:]]
    for reader in readers:
        reader.start()
    said = None
    try:
        while (line := lines.get(timeout=seconds)) is not None:
            if line.startswith(prefix):
                said = line.rstrip("\n")
                break
    except queue.Empty:
        pass
    for proc in procs:
        proc.kill()
    for reader in readers:
        reader.join()
    for proc in procs:
        proc.wait()
    return said, ["".join(e) for e in errors]


def test_every_worker_is_each_workers_values_gathered_over_the_strategy():
    """`EveryWorker` (the tasks' agreement on the step to resume from: the killed-peer test
    above) over the strategy's collectives, here one worker's."""
    import tensorflow as tf

    from dare_tf.training.engines.tensorflow.distribution import EveryWorker

    every = EveryWorker(tf.distribute.get_strategy())
    np.testing.assert_array_equal(every._gathered(np.array([10, 20], np.int32)), [[10, 20]])
    assert every.common([10, 20]) == [10, 20] and every.common([]) == []
    assert every.all(True) and not every.all(False)


def test_gather_workers_traces_its_function_once_a_kind_of_arrays():
    """(Before, a trace at every call: at each validation of a multi-worker run, and
    TensorFlow's warning about a function traced again and again in its log.)"""
    import tensorflow as tf

    from dare_tf.training.engines.tensorflow.distribution import gather_function, gather_workers

    strategy = tf.distribute.get_strategy()
    before = gather_function(strategy).experimental_get_tracing_count()
    for n in (3, 5, 7, 9, 11, 2):
        got = gather_workers(strategy, {"p": np.arange(n, dtype=np.float32), "ids": np.ones((n, 2), np.int64)})
        np.testing.assert_array_equal(got["p"], np.arange(n))
        assert got["ids"].shape == (n, 2)
    assert gather_function(strategy).experimental_get_tracing_count() - before <= 2
