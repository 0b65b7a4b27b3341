"""The backend-agnostic tests (layers, DareModel, its loss, fit and evaluate) on
Keras's JAX backend, in a process of their own (a process has one backend)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.no_tensorflow import pytest_on_jax

pytest.importorskip("jax")


# One process (a JAX start-up costs more than the tests it would share). (The baselines'
# numpy checks in tests/search build whole models: they run on TensorFlow only; on JAX the
# contract covers every search stage.) The models' suite runs without its docstring
# examples, numpy-only checks, DIN's loss (DARE's covers the composition), the layers'
# configs and the tables' memory refusal (backend-independent: the TensorFlow run checks them).
@pytest.mark.slow
def test_layers_and_models_on_jax():
    """The tests above on JAX, in a process where TensorFlow cannot load (tests/no_tensorflow.py:
    the tests that use it are TensorFlow's alone; Keras's serialization looks for it, finding it absent)."""
    done = pytest_on_jax("tests/layers", "tests/search/test_contract.py", "tests/search/test_top_k.py",
                         "tests/test_keras_models.py", "-k", "not docstring_examples and not prediction_head and "
                         "not sample_weights and not every_layer_serializes and not numpy[din] and not "
                         "larger_than_the_memory")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


@pytest.mark.slow
def test_models_train_on_jax_without_importing_tensorflow():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    script = ("import sys, numpy as np, dare_tf\n"
              "m = dare_tf.build_model('dare', 50, 5, max_len=8, top_k=3, seed=0)\n"
              "m.compile(optimizer='adam')\n"
              "x = m.dummy_inputs(4); y = np.array([1.0, 0.0, 1.0, 0.0])\n"
              "m.fit(x, y, verbose=0); loss = m.evaluate(x, y, verbose=0)\n"
              "ranked = m.rank({'hist_items': x['hist_items'][:2], 'hist_categories': x['hist_categories'][:2],\n"
              "                 'candidate_items': np.ones((2, 3), 'int32'),\n"
              "                 'candidate_categories': np.ones((2, 3), 'int32')})\n"
              "print(np.isfinite(loss), 'tensorflow' in sys.modules, tuple(ranked.shape))\n"
              "from dare_tf.training import TrainConfig, train\n"
              "try:\n    train('nowhere', 'nowhere', TrainConfig.create(preset='dare'))\n"
              "except FileNotFoundError as e:\n    print(e)\n"
              "print('tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-3] == "True False (2, 3)", done.stdout
    # the trainer runs on JAX (tests/training/test_jax_loop.py): it reaches the dataset, still without TensorFlow
    assert lines[-2] == "nowhere/spec.json not found: is 'nowhere' a prepared dataset (python -m data.prepare ...)?"
    assert lines[-1] == "False", done.stdout


def test_quiet_loads_tensorflow_without_its_start_up_notices():
    """First-day issue (7): `import dare_tf` in a user's script then a model printed TensorFlow's C++
    start-up lines that the programs filter; `dare_tf.quiet()` first (the README's snippet) hides
    them too and leaves other output alone. What TensorFlow prints differs by machine (oneDNN's
    notice on a CPU with AVX-512 and TF_ENABLE_ONEDNN_OPTS unset or 1, a CUDA stub's lines, CPU
    feature notes, or nothing): whatever this machine's TensorFlow printed without `quiet()`, with it
    stderr holds the script's own line alone (the filter's rules: the test below)."""
    import subprocess
    import sys

    from tests.conftest import LOUD_ENV, REPO

    script = ("import dare_tf; dare_tf.quiet()\nimport keras, sys\n"
              "dare_tf.build_model('dare', num_items=100, num_categories=10, max_len=20)\n"
              "print('to stderr', file=sys.stderr)\n")
    env = dict(LOUD_ENV, KERAS_BACKEND="tensorflow")
    loud = subprocess.run([sys.executable, "-c", script.replace("dare_tf.quiet()", "pass")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and "to stderr" in loud.stderr.splitlines(), loud.stderr
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stderr.splitlines() == ["to stderr"], (done.stderr, loud.stderr)


# What TensorFlow 2.21 prints at start-up on the machines the suite has run on (Intel and AMD x86-64
# with and without AVX-512, TF_ENABLE_ONEDNN_OPTS 0 and 1, aarch64): `quiet()` hides each of them.
START_UP_NOTICES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795878838.694922   13909 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795878838.695274   13909 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "I0000 00:00:1795878839.198225   13909 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    "E0000 00:00:1795878857.190035   13963 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
    "call to cuInit: UNKNOWN ERROR (303)",
]


def test_quiet_hides_every_known_start_up_notice_and_keeps_other_lines(tmp_path):
    """The filter itself, the same on any machine: a stand-in `tensorflow` package writes each known
    start-up notice (START_UP_NOTICES) and a real error straight to file descriptor 2, at import and
    when its devices are listed (during `quiet()` and again after it); after `dare_tf.quiet()` only
    the error and the script's own lines show, in order."""
    import subprocess
    import sys

    from tests.conftest import LOUD_ENV, REPO

    fake = tmp_path / "tensorflow"
    fake.mkdir()
    error = "E0000 00:00:1.0  1 some_op.cc:7] a real error the user must see"
    (fake / "__init__.py").write_text(
        "import os\n"
        f"NOTICES = {START_UP_NOTICES[:3]!r}\n"
        f"LATER = {START_UP_NOTICES[3:] + [error]!r}\n"
        "for line in NOTICES:\n    os.write(2, (line + '\\n').encode())\n"
        "class config:\n"
        "    @staticmethod\n"
        "    def list_physical_devices():\n"
        "        for line in LATER:\n            os.write(2, (line + '\\n').encode())\n"
        "        return []\n")
    script = ("import sys, dare_tf\nprint('before', file=sys.stderr)\ndare_tf.quiet()\n"
              "import tensorflow as tf\ntf.config.list_physical_devices()\nprint('after', file=sys.stderr)\n")
    env = dict(LOUD_ENV, KERAS_BACKEND="tensorflow", PYTHONPATH=f"{tmp_path}:{REPO}")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["before", error, error, "after"], done.stderr  # (at import, then later)
    loud = subprocess.run([sys.executable, "-c", script.replace("dare_tf.quiet()", "pass")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert loud.stderr.splitlines() == ["before", *START_UP_NOTICES, error, "after"], loud.stderr
