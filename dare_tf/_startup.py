"""Imports TensorFlow with its known harmless start-up lines filtered out.

TensorFlow 2.21 prints, before its logging is set up and whatever
TF_CPP_MIN_LOG_LEVEL says, notices such as "oneDNN custom operations are
on", "Could not find cuda drivers on your machine" and, on a CPU-only
machine, "failed call to cuInit: CUDA error". While TensorFlow is imported
and its devices are listed, stderr is captured; every line not on the list
below is written back, so real errors stay visible. Set
TF_CPP_MIN_LOG_LEVEL=0 to see everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

_HARMLESS = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|oneDNN custom operations are on"
    r"|Could not find cuda drivers on your machine"
    r"|failed call to cuInit"
    r"|TF-TRT Warning"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions"
    r"|rebuild TensorFlow with the appropriate compiler flags"
    r"|cuda_executor|cuda_diagnostics|kernel driver does not appear to be running"
    # oneDNN's notice, on a CPU its dtype check does not count as AVX-512 (AMD EPYC), that an
    # op runs on Eigen instead: printed at the first such op, whatever TF_CPP_MIN_LOG_LEVEL says.
    r"|oneDNN supports DT_\w+ only on platforms with AVX-512"
    # A multi-worker peer that went away: the collectives' own lines before the trainer's
    # one-line error (dare_tf.training.engines.tensorflow.distribution.ClusterError) says which task and why.
    r"|ring_alg\.cc.*Aborting Ring|base_collective_executor\.cc.*StartAbort|collective_ops_utils|"
    r"Additional GRPC error information from remote target|^:UNKNOWN:Error received from peer"
    r"|^The error could be from a previous operation\. Restart your program to reset"
    # gRPC's event engine on the socket the gone peer closed (some runs, not all).
    r"|ev_epoll1_linux\.cc.*epoll_wait error: Bad file descriptor"
    # gRPC's client transport when a server it talked to closes the connection (the demo's
    # stand-in stopping): the client's own one-line error says what failed, if anything did.
    r"|chttp2_transport\.cc.*Got goaway")


_REAL_STDERR: list[int] = []  # the real stderr of each open FilteredStderr, innermost last


def write_stderr(text: str) -> None:
    """Writes `text` to the real stderr at once, past an open `FilteredStderr`'s
    pipe: for a message a process prints just before `os._exit`."""
    os.write(_REAL_STDERR[-1] if _REAL_STDERR else 2, text.encode())


class FilteredStderr:
    """While open, file descriptor 2 goes through a pipe whose lines, less the
    harmless TensorFlow notices above, a thread writes to the real stderr: the
    notices TensorFlow prints while a program runs (not only at import). For
    the programs (`dare_tf.cli.run`); off with TF_CPP_MIN_LOG_LEVEL=0."""

    def __enter__(self):
        import threading

        self.saved = None
        if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
            return self
        try:
            self.saved = os.dup(2)
        except OSError:  # no usable stderr
            return self
        read, write = os.pipe()
        sys.stderr.flush()
        _REAL_STDERR.append(self.saved)
        os.dup2(write, 2)
        os.close(write)
        self.thread = threading.Thread(target=self._forward, args=(read,), daemon=True)
        self.thread.start()
        return self

    def _forward(self, read: int) -> None:
        with os.fdopen(read, "rb") as lines:
            for line in lines:
                if not _HARMLESS.search(line.decode(errors="replace")):
                    os.write(self.saved, line)

    def __exit__(self, *exc):
        if self.saved is None:
            return
        sys.stderr.flush()
        _REAL_STDERR.remove(self.saved)
        os.dup2(self.saved, 2)  # the pipe's last writer closed: the thread ends after its last line
        self.thread.join(timeout=5)
        os.close(self.saved)


def configured_backend() -> str:
    """The Keras backend that `import keras` will pick, found without importing keras."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    path = os.path.join(os.environ.get("KERAS_HOME", os.path.join(os.path.expanduser("~"), ".keras")),
                        "keras.json")
    try:
        import json

        with open(path) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


# Optional imports that Keras and TensorFlow try at their own import, for features no program
# here uses: Keras's scikit-learn estimator wrappers and image galleries (matplotlib's pyplot),
# and on TensorFlow's backend TensorFlow Lite's converter of JAX functions. Measured here: a
# program's `import tensorflow` (Keras with it) 4.3 CPU seconds, 3.0 without the first and the
# last, 2.5 without matplotlib too; Keras on JAX 2.4, 1.6 without scikit-learn. (The analysis
# program imports matplotlib itself, after Keras: hidden only while Keras loads.)
UNUSED_AT_IMPORT = {"tensorflow": ("jax", "sklearn", "matplotlib"), "jax": ("sklearn", "matplotlib")}


@contextlib.contextmanager
def _hidden(names):
    """While open, the modules `names` that this process has not imported yet cannot be
    imported (an optional import falls back as where the package is absent); once
    closed, they import as usual."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # (Python's own "import halted" marker)
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def without_unused_imports(backend: str):
    """`UNUSED_AT_IMPORT[backend]` hidden while open (`_hidden`). For the programs while
    they load Keras (`dare_tf.cli.run`): a program loads only what it uses."""
    return _hidden(UNUSED_AT_IMPORT.get(backend, ()))


# glibc's malloc: blocks under this many bytes come from the heap, not a mapping of their own,
# and freed memory at the heap's top is given back to the system past the second figure
# (mallopt's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD; glibc's defaults: 128 KiB each, the first
# growing with the mapped blocks freed, up to 32 MiB on 64-bit machines, the second to twice it).
MALLOC_MMAP_THRESHOLD = 256 << 20
MALLOC_TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # (glibc's malloc.h)


def reuse_freed_memory() -> bool:
    """Where the C library is glibc: a freed block of up to `MALLOC_MMAP_THRESHOLD`
    bytes is reused by the next allocation instead of being unmapped and mapped afresh
    (each of its pages then faulted in and zeroed by the kernel again). XLA's CPU
    runtime allocates each step's buffers this way: measured, a 20-step training
    process on JAX (the brands walkthrough's data, docs/data.md) 1.17M page faults
    and 9.9 CPU s before, 0.40M and 8.7 s after, its peak memory 1.24 -> 1.38 GB; one
    on TensorFlow the same within noise. Process-wide and kept (glibc cannot be asked
    for the values it replaces). Returns whether it was set (not on another C library)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # (glibc's own: musl has a mallopt that ignores these)
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


# Set to True by a process that runs programs inside itself with its own objects frozen for good
# (the tests' workers, tests/conftest.py): `start_up_frozen` then need not count what is frozen,
# which costs a walk over every frozen object (measured: 58 ms a program in a test worker).
HOST_FROZEN = False


@contextlib.contextmanager
def start_up_frozen():
    """While open, every object alive when it opened (after a program's imports:
    modules, classes and functions by the hundred thousand, kept to the exit) is out
    of the garbage collector's sight (`gc.freeze`): its collections during the
    program's work traverse only what the work allocates. Where the process had
    frozen nothing itself, what this froze is unfrozen on closing: a program run
    inside a longer process (a test, a notebook) leaves the collector as it found
    it. For `dare_tf.cli.run`, around a program's work."""
    import gc

    frozen_before = HOST_FROZEN or gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


def set_random_seed(seed: int) -> None:
    """`keras.utils.set_random_seed`, which also seeds TensorFlow where it is installed,
    importing it into a process on another backend that never uses it (measured: 2.9
    CPU seconds more, and a peak memory of 766 MB instead of 297 MB, in a process
    that imports Keras on JAX and seeds it). There TensorFlow, unless this process
    imported it already, is hidden from the call (`_hidden`), and Keras takes it as
    absent for the rest of the process (its serialization asks the same question)."""
    import keras

    with _hidden(() if keras.backend.backend() == "tensorflow" else ("tensorflow",)):
        keras.utils.set_random_seed(seed)


def import_tensorflow_quietly() -> None:
    if ("tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"
            or configured_backend() != "tensorflow"):
        return
    try:
        saved = os.dup(2)
    except OSError:  # no usable stderr
        return
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        for line in captured.read().decode(errors="replace").splitlines():
            if line.strip() and not _HARMLESS.search(line):
                print(line, file=sys.stderr)


def quiet_tensorflow():
    """TensorFlow, imported without its start-up notices when this is its first
    use (a program of numpy alone reading TFRecord shards: `data.prepare --append`)."""
    import_tensorflow_quietly()
    import tensorflow as tf

    return tf
