"""Where the JAX trainer's arrays live: one device, or `keras.distribution`'s
data parallelism over every device (`DataParallel`) or a mesh whose `model`
axis shards the item and category tables along their vocabulary
(`ModelParallel` with a `LayoutMap`), across processes where
`keras.distribution.initialize` joined several (docs/gpu.md); and which of the
trainer's options are TensorFlow's alone (`refusal`). No TensorFlow."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
import time

import jax
import keras
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from dare_tf._faces import public
from dare_tf.training.checkpoints import EveryProcess
from dare_tf.training.sections import TF_DISTRIBUTED

# The variables `model_parallel` shards along their first axis (the vocabulary): every
# vocabulary table of a behaviour (items, categories, a field's values), not positions.
TABLES = r"^(?!.*position_embedding$).*_embedding$"


@public("dare_tf.training")
def refusal(config) -> str | None:
    """The one-line refusal of a configuration the trainer on JAX does not run, naming the alternative."""
    if config.runtime.strategy in TF_DISTRIBUTED:
        return (f"--strategy={config.runtime.strategy} is tf.distribute's; on JAX use --strategy=data_parallel or "
                "--strategy=model_parallel (keras.distribution, docs/gpu.md)")
    return None


# Seconds after which the coordination service takes a process that stopped sending its
# heartbeats for gone and ends the others with XLA's own error (its default is 100 s). The
# watch below knows sooner (`SILENT_S`) and says so in the package's line: this is its backstop.
HEARTBEAT_S = 60
# Seconds after which the watch takes a process whose own beats stopped for gone: well under
# `HEARTBEAT_S`, so that its line, not XLA's, ends the others (where both waited for the
# service's heartbeats, whichever came first ended the process); well over the few seconds a
# busy process's thread may wait for the interpreter.
SILENT_S = 15


def join_processes(timeout_s: int) -> None:
    """Joins the processes `keras.distribution.initialize`'s environment variables
    name (`KERAS_DISTRIBUTION_JOB_ADDRESSES`, `_NUM_PROCESSES`, `_PROCESS_ID`; the
    first address is the coordinator's) through `jax.distributed`, waiting up to
    `timeout_s` for all of them, the CPU's collectives over gloo (a GPU's are NCCL's
    whatever this says). A thread then watches the others: where one is gone, this
    process ends in one line saying so, instead of waiting in a collective."""
    count = int(os.environ["KERAS_DISTRIBUTION_NUM_PROCESSES"])
    addresses = os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
    index = os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID")
    if not addresses or index is None:
        raise ValueError("KERAS_DISTRIBUTION_NUM_PROCESSES > 1 needs KERAS_DISTRIBUTION_JOB_ADDRESSES (the "
                         "coordinator's HOST:PORT first) and KERAS_DISTRIBUTION_PROCESS_ID (docs/gpu.md)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # (the shutdown barrier keeps its 300 s: a process that finished waits there while process 0
    # writes the run's results)
    jax.distributed.initialize(addresses.split(",")[0], count, int(index), initialization_timeout=timeout_s,
                               heartbeat_timeout_seconds=HEARTBEAT_S)
    # (at exit the watch ends before JAX's own shutdown, registered before this: the processes leave
    # the coordination service one by one, which is no peer lost)
    global _JOINED
    _JOINED = (int(index), count)
    atexit.register(_EXITING.set)
    threading.Thread(target=_watch, args=(count, int(index)), daemon=True, name="peers").start()


_JOINED: tuple[int, int] | None = None  # (this process's index and the run's count, once joined)
_EXITING = threading.Event()
WATCH_S = 1  # (how often the watch beats and asks the coordination service)
BEATS = "dare_tf/beats/"  # (the key-value directory of the processes' beats: a count, or LEFT)
LEFT = "left"


def _finished() -> None:
    """(a process's run ended well) the others are told this process leaves, not that it stopped
    answering: it waits in JAX's shutdown while process 0 writes the results. (Not where it
    ended in an error: its silence ends the others.)"""
    if _JOINED is not None:
        with contextlib.suppress(Exception):
            _client().key_value_set(f"{BEATS}{_JOINED[0]}", LEFT, allow_overwrite=True)


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def _end(why: str) -> None:
    """Ends this process of a run whose processes lost each other, in one line (at once:
    `jax.distributed`'s shutdown would wait for the gone process)."""
    from dare_tf._startup import write_stderr

    # (not `jax.process_index()`: where no array was made yet, it would first join the devices of every
    # process, the gone one's too, and wait for it)
    index, count = _JOINED
    write_stderr(f"error: {why}; process {index} of {count} ends too. Start every "
                 "process again with the same flags: the run resumes from its last checkpoint\n")
    os._exit(1)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _watch(count: int, index: int) -> None:
    """(`join_processes`'s thread) each second, beats (a count in the coordination service's
    key-value store), and ends this process in one line where another one's beats stopped for
    `SILENT_S`. (Not the service's `get_live_nodes`: it waits for every process it still takes
    for alive, a killed one until its heartbeats time out.)"""
    client = _client()
    heard: dict[int, tuple] = {}  # (each other process: its last beat, and when it changed)
    beat = 0
    while not _EXITING.wait(WATCH_S):
        beat += 1
        try:
            client.key_value_set(f"{BEATS}{index}", str(beat), allow_overwrite=True)
            beats = dict(client.key_value_dir_get(BEATS))
        except Exception as e:  # noqa: BLE001 (the coordinator itself gone: its client's errors alike)
            if _EXITING.is_set():  # (this process's own shutdown under way)
                return
            _end(f"the run's coordinator (process 0) stopped answering ({_first_line(e)})")
        now = time.monotonic()
        for other in set(range(count)) - {index}:
            value = beats.get(f"{BEATS}{other}")
            if other not in heard or heard[other][0] != value:
                heard[other] = (value, now)
        silent = sorted(other for other, (value, since) in heard.items() if value != LEFT and now - since > SILENT_S)
        if silent and not _EXITING.is_set():
            _end(f"the run's processes {silent} stopped answering")


@contextlib.contextmanager
def peers_lost_end_the_process():
    """Around a run over several processes: a collective that fails because another
    process is gone (a closed connection, a timeout) ends this one in one line; a run that
    ended well tells the others' watches that this process leaves."""
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        if jax.process_count() == 1:
            raise
        _end(f"a collective with the run's other processes failed, one of them is gone ({_first_line(e)})")
    _finished()


class EveryJaxProcess(EveryProcess):
    """What every process of a run over several processes holds (`EveryProcess`),
    over JAX's collectives (`JaxCheckpoints.restore_latest`'s agreement on the step
    to resume from)."""

    def _gathered(self, values: np.ndarray) -> np.ndarray:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(values)).reshape(jax.process_count(), -1)


COMPILATION_CACHE_BYTES = 2**30
# Every compiled function is kept, not only those over JAX's default of 1 s: a run's start is
# mostly many small compiles (a variable's initializer, a metric, a sharded copy), and on a CPU
# each is under 1 s (measured: a 20-step DARE run over 4 devices, 13.5 CPU s cold, 7 s with
# them all read from the cache, 12.5 s with only JAX's default kept).
MIN_COMPILE_S_KEPT = 0.0


def use_compilation_cache(folder: str) -> str | None:
    """Keeps this process's compiled functions in JAX's persistent compilation cache
    at `folder` (`RuntimeConfig.compilation_cache`;
    `none`, no cache; empty: `JAX_COMPILATION_CACHE_DIR` where it is set, else the
    user's cache folder), every one however fast it compiled (unless
    `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` says otherwise); returns the folder used."""
    if folder == "none":
        return None
    from jax.experimental.compilation_cache import compilation_cache

    if not folder and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        # (JAX's own folder, which other JAX programs may share: its size and eviction stay JAX's
        # settings, so that every process writing there locks and evicts alike)
        folder = os.environ["JAX_COMPILATION_CACHE_DIR"]
    else:
        folder = folder or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                        "dare_tf", "jax")
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S_KEPT)
    compilation_cache.set_cache_dir(folder)
    compilation_cache.reset_cache()  # (JAX decides at its first compile; something may have compiled already)
    return folder


def distribution_for(runtime):
    """The `keras.distribution` of `runtime.strategy` (None for `default`); joins
    the processes `keras.distribution.initialize`'s environment variables name
    first (several hosts: `join_processes`)."""
    if int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1")) > 1 and not jax.distributed.is_initialized():
        join_processes(runtime.join_timeout_s)
    devices = jax.devices()
    if runtime.strategy == "data_parallel":
        return keras.distribution.DataParallel(devices=devices)
    if runtime.strategy == "model_parallel":
        shards = runtime.model_shards or len(devices)
        if len(devices) % shards:
            raise ValueError(f"--model_shards={shards} must divide the {len(devices)} devices")
        mesh = keras.distribution.DeviceMesh((len(devices) // shards, shards), ["batch", "model"], devices)
        layout = keras.distribution.LayoutMap(mesh)
        layout[TABLES] = ("model", None)
        return keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")
    return None


@public("dare_tf.training")
class Placement:
    """Puts the trainer's arrays where `distribution` (None: the first device)
    wants them: the store and columns replicated on every device, the steps'
    example indices split along the mesh's batch axis; the jitted training
    function keeps the variables' layouts (`jit_shardings`)."""

    def __init__(self, distribution=None):
        self.distribution = distribution
        self.mesh = None if distribution is None else distribution.device_mesh.backend_mesh
        axis = None if distribution is None else distribution.batch_dim_name
        self.batch_axis = axis
        self.batch_shards = 1 if self.mesh is None else self.mesh.shape[axis]
        self.model_shards = 1 if self.mesh is None or "model" not in self.mesh.shape else self.mesh.shape["model"]

    def describe(self) -> str:
        if self.mesh is None:
            return f"one device, {jax.devices()[0].platform}"
        name = type(self.distribution).__name__
        return f"{name} over {self.mesh.size} {jax.devices()[0].platform} devices, mesh {dict(self.mesh.shape)}"

    def scope(self):
        return contextlib.nullcontext() if self.distribution is None else self.distribution.scope()

    def _sharding(self, *spec):
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def _put(self, array: np.ndarray, sharding):
        if sharding is None:
            return jax.device_put(array)
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    def replicate(self, array: np.ndarray):
        return self._put(array, None if self.mesh is None else self._sharding())

    def rows(self, rows: np.ndarray):
        """`[S, B]` example indices: each step's batch split over the batch axis."""
        return self._put(rows, None if self.mesh is None else self._sharding(None, self.batch_axis))

    def batch(self, rows: np.ndarray):
        return self._put(rows, None if self.mesh is None else self._sharding(self.batch_axis))

    @staticmethod
    def host(array) -> np.ndarray:
        """`array`'s whole value on this host, also where it spans other processes'
        devices (several hosts: gathered from every process, a collective each calls)."""
        if not isinstance(array, jax.Array) or array.is_fully_addressable:
            return np.asarray(array)
        if array.is_fully_replicated:
            return np.asarray(array.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))

    def jit_shardings(self, state) -> dict:
        """`jax.jit`'s arguments that keep `state`'s layouts across the training function."""
        if self.mesh is None:
            return {}
        return {"out_shardings": (jax.tree.map(lambda a: a.sharding, state), self._sharding())}

    def fit_model_config(self, model_config):
        """`model_config` with its tables' rows a multiple of the model axis (a sharded
        axis divides evenly; the vocabularies stay the dataset's, `BehaviorEmbedding`'s
        `row_multiple`)."""
        if self.model_shards == 1:
            return model_config
        return dataclasses.replace(model_config, table_row_multiple=self.model_shards)


def bytes_per_device(variables) -> dict[str, int]:
    """Bytes of `variables` each device holds (its shards), by device."""
    out: dict[str, int] = {}
    for variable in variables:
        for shard in variable.value.addressable_shards:
            out[str(shard.device)] = out.get(str(shard.device), 0) + shard.data.nbytes
    return out


__all__ = ["Placement", "bytes_per_device", "distribution_for", "join_processes", "peers_lost_end_the_process",
           "refusal"]
