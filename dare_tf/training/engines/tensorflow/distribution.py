"""Distribution: strategies, workers and their partitions, collective gathers, and the
training loop for datasets a strategy already distributed."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import tensorflow as tf

from dare_tf._faces import public
from dare_tf.training.checkpoints import EveryProcess
from dare_tf.training.config import JAX_DISTRIBUTED, STRATEGIES
from dare_tf.training.workers import is_chief, task_id, worker_index, worker_partitions  # noqa: F401 (re-exported)


@public("dare_tf.training")
def make_strategy(name: str, cpu_devices: int = 0, join_timeout_s: float = 300) -> tf.distribute.Strategy:
    """The distribution strategy; call before any other TensorFlow work.

    `cpu_devices > 1` splits the CPU into that many logical devices (so
    `mirrored` has replicas on a CPU-only machine). `multi_worker` waits at
    most `join_timeout_s` for every task of TF_CONFIG's cluster (`join_cluster`).
    """
    if name in JAX_DISTRIBUTED:
        raise ValueError(f"strategy={name} is keras.distribution's, on JAX (KERAS_BACKEND=jax, docs/gpu.md); "
                         "on TensorFlow use --strategy=mirrored or multi_worker")
    if cpu_devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy=multi_worker needs the TF_CONFIG environment variable "
                             "(cluster and task); see the README")
        return join_cluster(join_timeout_s)
    raise ValueError(f"strategy={name!r}: expected one of {STRATEGIES}")


def join_cluster(timeout_s: float) -> tf.distribute.Strategy:
    """`tf.distribute.MultiWorkerMirroredStrategy()`, whose construction waits for
    every task of TF_CONFIG's cluster for good. With TensorFlow's coordination
    service (its default) that wait holds Python's lock and a preemption notifier
    swallows SIGTERM; this turns the service off (`tensorflow.python.eager.context`,
    read here only), so the wait is TensorFlow's own first all-reduce, which lets
    Python run: a watchdog thread ends the process with a one-line error past
    `timeout_s` (exit code 1) or at Ctrl-C (130), and SIGTERM keeps its default
    action. A peer that goes away later is found by the collectives themselves
    (a closed socket aborts the step: `ClusterError`) or by the strategy's health
    check (a peer that stops answering)."""
    import select
    import signal
    import socket
    import threading
    import time

    from tensorflow.python.eager import context

    from dare_tf._startup import write_stderr

    tasks = [f"{kind}:{i}={address}" for kind, addresses in sorted(
        json.loads(os.environ["TF_CONFIG"]).get("cluster", {}).items()) for i, address in enumerate(addresses)]
    context.context().configure_coordination_service(service_type="")
    # The health check logs each retry before it aborts the collectives: ClusterError says it once.
    tf.get_logger().addFilter(lambda record: record.filename != "collective_all_reduce_strategy.py"
                              or record.levelno < 30)
    joined = threading.Event()
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    previous = signal.set_wakeup_fd(wake_write.fileno())  # Python's C handler writes the signal's number there

    def fail(text: str, code: int) -> None:
        write_stderr(f"error: {text}\n")
        os._exit(code)

    def watch():
        deadline = time.monotonic() + timeout_s
        while not joined.is_set():
            ready, _, _ = select.select([wake_read], [], [], 0.2)
            if ready and signal.SIGINT in wake_read.recv(64):
                fail("interrupted while waiting for the multi-worker cluster", 130)
            if time.monotonic() > deadline and not joined.is_set():
                fail(f"strategy=multi_worker: not every task of TF_CONFIG's cluster ({', '.join(tasks)}) started "
                     f"within --join_timeout_s={timeout_s:g} s; start them all (each with its own task index)", 1)

    watchdog = threading.Thread(target=watch, name="join-cluster", daemon=True)
    watchdog.start()
    try:
        return tf.distribute.MultiWorkerMirroredStrategy()
    finally:
        joined.set()
        watchdog.join()
        signal.set_wakeup_fd(previous)
        wake_read.close()
        wake_write.close()


class ClusterError(ConnectionError):
    """A peer of the multi-worker cluster went away during training."""

    @classmethod
    def of(cls, error: tf.errors.OpError) -> "ClusterError":
        """The one-line error for TensorFlow's aborted collective `error` (a
        step's closed connection, or the strategy's health check)."""
        import re

        task = r"(/job:\w+/replica:\d+/task:\d+)"
        peer = re.search(f"remote target {task}|{task} is down", error.message)
        peer = peer and (peer.group(1) or peer.group(2))
        return cls(f"strategy=multi_worker: {'task ' + peer if peer else 'a task of the cluster'} went away "
                   f"({type(error).__name__}); restart every task with the same flags: the run resumes from its last "
                   "checkpoint")


@public("dare_tf.training")
def gather_workers(strategy, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each array concatenated over all workers (in worker order), on every worker:
    collective all-gathers of this worker's arrays (padded to the longest), in one
    graph function a strategy traces once per kind of arrays (`gather_function`)."""
    count = len(next(iter(arrays.values())))
    values = {k: tf.constant(v) for k, v in arrays.items()}
    counts, gathered = strategy.run(gather_function(strategy), args=(tf.constant(count, tf.int64), values))
    counts = strategy.experimental_local_results(counts)[0].numpy()
    size = int(counts.max())
    out = {}
    for k, v in gathered.items():
        v = strategy.experimental_local_results(v)[0].numpy()
        out[k] = np.concatenate([v[i * size: i * size + int(c)] for i, c in enumerate(counts)])
    return out


_GATHERS: dict = {}  # id(strategy): (strategy, its gather function)


def gather_function(strategy) -> tf.types.experimental.PolymorphicFunction:
    """The replica function of `gather_workers` for `strategy`, made once a strategy
    (before, one per call: a trace at each validation, and TensorFlow's warning about
    functions traced again and again in the run's log)."""
    if id(strategy) not in _GATHERS:
        @tf.function(autograph=False, reduce_retracing=True)
        def gather(n, local):
            context = tf.distribute.get_replica_context()
            counts = context.all_gather(tf.reshape(n, [1]), axis=0)
            size = tf.reduce_max(counts)
            padded = {k: tf.pad(v, [[0, size - n]] + [[0, 0]] * (len(v.shape) - 1)) for k, v in local.items()}
            return counts, {k: context.all_gather(v, axis=0) for k, v in padded.items()}

        _GATHERS[id(strategy)] = (strategy, gather)  # (the strategy kept: its id is not reused)
    return _GATHERS[id(strategy)][1]


class EveryWorker(EveryProcess):
    """What every worker of a multi-worker run holds (`EveryProcess`), over the
    strategy's collective gathers (`gather_workers`): the agreement on the step
    that every worker resumes from."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy

    def _gathered(self, values: np.ndarray) -> np.ndarray:
        return gather_workers(self.strategy, {"values": values.reshape(1, -1)})["values"]


def fit_distributed(model, dataset, steps_per_epoch, epochs, initial_epoch, callbacks, verbose, shuffle):
    """`model.fit` for a dataset that a distribution strategy already distributed
    (each input pipeline keeps its slice of every global batch, so N replicas
    train on exactly the batches one process would).

    Measured with Keras 3.15.1 on TF 2.21: `fit` cannot take a distributed
    dataset (it tries to convert its per-replica values to tensors); under
    `MultiWorkerMirroredStrategy` Keras's own train function fails when it
    reduces the scalar logs ("Invalid reduction dimension 0 for input with 0
    dimensions"); under `MirroredStrategy` over 2 logical CPUs, `fit` with a
    plain dataset ran, but its weights after 2 steps differed from one
    process's by up to 0.04 (this loop: < 2e-3, the float-order noise of the
    all-reduce). This loop runs the model's own `train_step` (the one `fit`
    runs, with the same `compute_loss`) in `strategy.run`, reduces its logs
    over replicas, and drives the same callbacks.
    """
    del shuffle
    strategy = model.distribute_strategy
    callbacks = keras.callbacks.CallbackList(callbacks, model=model, add_progbar=bool(verbose),
                                             verbose=verbose, epochs=epochs, steps=steps_per_epoch)

    @tf.function(autograph=False)
    def train_function(iterator):
        logs = strategy.run(model.train_step, args=(next(iterator),))
        return {k: strategy.reduce("MEAN", v, axis=None) for k, v in logs.items()}

    iterator = iter(dataset)
    model.stop_training = False
    callbacks.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        logs = {}
        for batch in range(steps_per_epoch):
            callbacks.on_train_batch_begin(batch)
            try:
                logs = train_function(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                model.stop_training = True
                break
            logs = {k: float(v) for k, v in logs.items()}  # (train_step returns the metrics' results)
            callbacks.on_train_batch_end(batch, logs)
            if model.stop_training:
                break
        callbacks.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    callbacks.on_train_end()
