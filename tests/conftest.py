import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# The tests' models are tiny and compiled once each: XLA's optimisation passes cost more
# than they save (measured: the JAX model tests 97 s -> 73 s), and on the CPU its older
# elemental emitters compile a fusion faster than its MLIR fusion emitters (measured: the
# layers and models on JAX, tests/test_backends.py, 59 -> 40 CPU s; a 20-step JAX training
# process, cold, 12.4 -> 8.9). Subprocesses inherit it.
# (A process that trains for hundreds of steps is better off optimised: `pytest_on_jax(optimized=True)`.)
OLDER_CPU_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
UNOPTIMIZED = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_FLAGS", f"{UNOPTIMIZED} {OLDER_CPU_EMITTERS}")
# TensorFlow runs each op on one thread (intra-op; oneDNN's OpenMP too) and two ops at once
# (inter-op), in the tests' processes and the programs they start: the suite runs more processes
# than the machine has cores, and their thread pools' spinning only took cores from each other
# (measured on 2 cores: `make check`'s tests 124 and 131 -> 113 and 121 CPU s; the TensorFlow
# training and distribution tests 172 -> 163 CPU s, 128 -> 114 s). A reduction's sum order
# follows the thread count: the tests hold under either (docs/development.md).
for _name, _threads in (("TF_NUM_INTRAOP_THREADS", "1"), ("TF_NUM_INTEROP_THREADS", "2"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_name, _threads)
# In the tests' own processes `tf.keras` is Keras 2 (tf-keras) from the start, as the retrieval
# stage (tensorflow-recommenders) needs, so every test, the retrieval stage's among them, runs in
# one pytest run (dare_tf itself uses Keras 3, `import keras`, which this does not touch). The
# programs a test starts as processes get a user's environment, without it (USER_ENV, ENV):
# they switch it on themselves where they need it (`dare_tf.retrieval.use_keras2`).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# JAX's persistent compilation cache: one folder for the whole run, its processes and xdist
# workers (a compile done once is read by every later process: the JAX trainer's start halves),
# empty at the start as on a fresh machine, removed at the end; not the user's own cache.
if "DARE_TF_TEST_JAX_CACHE" not in os.environ:
    import tempfile

    os.environ["DARE_TF_TEST_JAX_CACHE"] = _OWN_JAX_CACHE = tempfile.mkdtemp(prefix="dare-tf-test-jax-cache-")
else:
    _OWN_JAX_CACHE = None
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["DARE_TF_TEST_JAX_CACHE"]
# (every process writing there locks and evicts alike: JAX's unbounded cache writes without its lock;
# the bound is the trainer's own, jax_distribution.COMPILATION_CACHE_BYTES, not imported here: it imports JAX)
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(2**30)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.cpu_times import listed, longest_first  # noqa: E402

pytest_plugins = ["tests.served"]  # the serving tests' shared export (`setup`)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The small real samples (../shared/data's README), where a checkout finds them: $DARE_TF_SAMPLES,
# else ../shared/data beside the checkout (as CI has it). No test needs them: the tests read
# generated logs in the same raw formats (TAOBAO_LOG, TMALL_LOG), and the checks on the real
# files (tests/test_real_samples.py) skip where they are absent.
SAMPLES_DIR = os.environ.get("DARE_TF_SAMPLES") or os.path.join(os.path.dirname(REPO), "shared", "data")
SAMPLE_FILES = {"taobao": os.path.join("taobao", "UserBehavior_sample.csv"),
                "tmall": os.path.join("tmall", "user_log_format1_sample.csv")}


def real_sample(name: str) -> str:
    """The real sample's path, or skips the test in one line saying where to put it."""
    path = os.path.join(SAMPLES_DIR, SAMPLE_FILES[name])
    if not os.path.exists(path):
        pytest.skip(f"the real {name} sample is not here: put ../shared/data beside the checkout, or set "
                    f"DARE_TF_SAMPLES to a folder holding {SAMPLE_FILES[name]}")
    return path


def _generated_samples() -> dict[str, str]:
    """Logs like the real samples (`data.synthetic --like=NAME --sample`, seed 0): the same
    raw formats and counts, written once per machine and generator version (under a lock:
    the xdist workers and the tfrs run import this module at once)."""
    import fcntl
    import hashlib
    import tempfile

    from dare_tf.data.generation import lifelike, like_presets, synthetic

    digest = hashlib.sha256()
    for module in (lifelike, like_presets, synthetic):
        with open(module.__file__, "rb") as f:
            digest.update(f.read())
    root = os.path.join(tempfile.gettempdir(), f"dare-tf-test-logs-{os.getuid()}-{digest.hexdigest()[:12]}")
    os.makedirs(root, exist_ok=True)
    paths = {name: os.path.join(root, os.path.basename(file)) for name, file in SAMPLE_FILES.items()}
    with open(os.path.join(root, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, path in paths.items():
            if not os.path.exists(path):
                lifelike.write_like(name, path, seed=0, sample=True)
    return paths


_SAMPLES = _generated_samples()
TAOBAO_LOG, TMALL_LOG = _SAMPLES["taobao"], _SAMPLES["tmall"]
# A user's environment: this one, less what the tests' own processes set for themselves.
USER_ENV = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
# The environment of the programs a test runs as processes (python -m trainers.train, ...).
ENV = dict(USER_ENV, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
# ... and a user's: no TF_CPP_MIN_LOG_LEVEL, so a test sees what the program prints by itself.
LOUD_ENV = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def noise(output: str) -> list[str]:
    """The lines of a program's output that a quiet program never prints:
    TensorFlow C++ and absl log lines (`I1124 ...`), retracing, serialization,
    oneDNN and CUDA notices."""
    import re

    return [line for line in output.splitlines()
            if re.match(r"^[IWE]\d{4} ", line) or re.search(r"retracing|non-serializable|oneDNN|cuda", line)]


def random_batch(rng, batch, length, num_items, num_categories, lengths=None):
    """Random model inputs; history b has `lengths[b]` real (non-padding) slots, left-padded."""
    if lengths is None:
        lengths = rng.integers(0, length + 1, batch)
    hist_items = rng.integers(1, num_items, (batch, length))
    hist_categories = rng.integers(1, num_categories, (batch, length))
    for b, n in enumerate(lengths):
        hist_items[b, : length - n] = 0
        hist_categories[b, : length - n] = 0
    return {
        "target_item": rng.integers(1, num_items, batch),
        "target_category": rng.integers(1, num_categories, batch),
        "hist_items": hist_items,
        "hist_categories": hist_categories,
    }


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def planted_presence_task(rng, n, length, num_items=200, num_categories=21):
    """Toy task: label = the target's category occurs among the real history slots.

    Each item has one fixed category; histories have 1..length real slots. With
    20 categories and ~length/2 slots, about half of the labels are positive.
    """
    item_category = np.concatenate([[0], rng.integers(1, num_categories, num_items - 1)])
    lengths = rng.integers(1, length + 1, n)
    x = random_batch(rng, n, length, num_items, num_categories, lengths)
    x["hist_categories"] = item_category[x["hist_items"]]
    x["target_category"] = item_category[x["target_item"]]
    y = np.array([tc in set(hc[hc > 0]) for tc, hc in zip(x["target_category"], x["hist_categories"])])
    return x, y.astype(np.float32)


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """A small planted log: 1,200 users, 60 categories, histories of 50."""
    from dare_tf.data.preparation.protocol import Protocol
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.generation.synthetic import SyntheticConfig, write

    root = tmp_path_factory.mktemp("planted")
    log = str(root / "log.csv")
    truth = write(SyntheticConfig(users=1200, items=3000, categories=60, min_length=80, max_length=160,
                                  seed=5), log)
    out = str(root / "prepared")
    prepare("taobao", log, out, Protocol(min_clicks=60, max_len=50, train_targets=8))
    return out, truth


@pytest.fixture(scope="session")
def taobao(tmp_path_factory):
    """The generated Taobao-sample-like log (TAOBAO_LOG), prepared once per test session
    (default protocol, seed 0)."""
    from dare_tf.data.preparation.in_memory import prepare

    out = str(tmp_path_factory.mktemp("prepared") / "taobao_sample")
    prepare("taobao", TAOBAO_LOG, out)
    return out


@pytest.fixture(scope="session")
def real_taobao(tmp_path_factory):
    """The real Taobao sample prepared as `taobao` prepares the generated one; skips in one
    line where the sample is absent."""
    from dare_tf.data.preparation.in_memory import prepare

    path = real_sample("taobao")
    out = str(tmp_path_factory.mktemp("prepared") / "real_taobao_sample")
    prepare("taobao", path, out)
    return out


def pytest_configure(config):
    """The tests' own processes on Keras's TensorFlow backend run their graph functions
    without Grappler's optimisation passes, as XLA's (above): the tests' graphs are tiny and
    each is traced once, and the passes cost more than they save (measured: the pinned
    runs' CPU time 13% lower, their metrics the same within the pinned 1e-4). The programs
    a test starts as processes keep TensorFlow's defaults. Nor does each graph op they
    trace record the Python stack that created it (TensorFlow's `_create_c_op`,
    `extract_traceback`: the "defined at" lines of its graph errors, which no test reads;
    measured: the Keras model, export-field and evaluation tests 52.6 -> 49.6 and 51.4 ->
    48.5 CPU s). On Keras's JAX backend, they reuse freed memory as the programs do
    (`reuse_freed_memory`: XLA's buffers of each step): the trainer's tests on JAX
    (tests/training/test_engines.py) 77 -> 68 CPU s, 12.3 -> 4.1 of them in the kernel; on
    TensorFlow it changed nothing measurable. pytest-xdist takes the tests in
    the order `pytest_collection_modifyitems` gives them (the longest first), not
    reordered by its groups' sizes."""
    from dare_tf._startup import configured_backend, import_tensorflow_quietly

    if hasattr(config.option, "loadscopereorder"):  # (pytest-xdist: its units in our order, longest first)
        config.option.loadscopereorder = False
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # (pytest-xdist's controller runs no test: TensorFlow loads in its workers alone)
    if configured_backend() == "jax":  # (the JAX suites' processes: tests/no_tensorflow.py's pytest_on_jax)
        from dare_tf._startup import reuse_freed_memory

        reuse_freed_memory()
    if configured_backend() == "tensorflow":
        import functools

        import_tensorflow_quietly()
        import tensorflow as tf
        from tensorflow.python.framework import ops

        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
        ops._create_c_op = functools.partial(ops._create_c_op, extract_traceback=False)


def pytest_sessionfinish(session):
    """Under `make coverage`, this process's coverage is saved here, not only at its exit:
    pytest-xdist kills a worker that has not exited 10 s after the run (TensorFlow's and
    JAX's teardown and coverage's own save on a loaded machine), losing all it measured
    (a coverage run of the suite: every file one worker ran at 0%)."""
    import sys

    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is not None:
        current.save()


def pytest_unconfigure(config):
    """The run's JAX compilation cache goes with the run that made it."""
    import shutil

    if _OWN_JAX_CACHE:
        shutil.rmtree(_OWN_JAX_CACHE, ignore_errors=True)


@pytest.hookimpl(wrapper=True)  # the groups are set before xdist reads them
def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` (in their code, or listed in tests/slow.txt), and groups that
    share an expensive module fixture
    (`xdist_group`: `make test` runs `--dist loadgroup`, one worker per group),
    run first, the longest first by the CPU seconds tests/slow.txt gives them
    (`tests.cpu_times.longest_first`): under the xdist workers the long work starts
    at once and the short tests fill the gaps, instead of a long test starting last.

    The tests marked `tfrs` (tensorflow-recommenders) need `tf.keras` to be
    Keras 2 from the start of their process (`TF_USE_LEGACY_KERAS=1`, which this
    module sets unless the environment says otherwise); where it is not, they
    are skipped, saying so."""
    slow = listed()  # (tests/slow.txt: measured slow, tests/cpu_times.py)
    for item in items:
        if item.nodeid.split("@")[0] in slow:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
        skip = pytest.mark.skip(reason="tensorflow-recommenders needs tf.keras to be Keras 2: run without "
                                       "TF_USE_LEGACY_KERAS set, or with it 1 (tests/conftest.py)")
        for item in items:
            if item.get_closest_marker("tfrs"):
                item.add_marker(skip)
    longest_first(items, slow)
    return (yield)


@pytest.fixture(scope="session")
def two_stage(taobao, tmp_path_factory):
    """A retrieval run and a DARE run (top_k 10) on the Taobao sample: run directories
    `retrieval` and `dare` (for the `tfrs` tests)."""
    from dare_tf.metrics import CASCADE_CANDIDATES
    from dare_tf.retrieval import RetrievalConfig, train_retrieval
    from dare_tf.training import TrainConfig, train

    work = tmp_path_factory.mktemp("two_stage")
    runs = {"retrieval": str(work / "retrieval"), "dare": str(work / "dare")}
    train_retrieval(taobao, runs["retrieval"], RetrievalConfig(epochs=2, batch_size=256,
                                                                cascade_candidates=(CASCADE_CANDIDATES,)))
    train(taobao, runs["dare"], TrainConfig.create(preset="dare", batch_size=256, epochs=1, eval_every=20, verbose=0,
                                                   model_overrides=dict(top_k=10)))
    return runs


def pytest_collection_finish(session):
    """The objects alive once the tests are collected (TensorFlow's, Keras's and JAX's
    modules, classes and functions, by the hundred thousand, kept to the end) are out of
    the garbage collector's sight (`gc.freeze`, as the programs' `start_up_frozen`): its
    full collections during the tests scan only what the tests made. Measured: `make
    check`'s tests 106 and 108 -> 98 and 101 CPU s."""
    import gc

    gc.collect()
    gc.freeze()
    # (kept frozen to the end: the programs the tests run inside this process need not count it)
    from dare_tf import _startup

    _startup.HOST_FROZEN = True
