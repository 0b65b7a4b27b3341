"""The backend-agnostic tests (layers, DareModel, its loss, fit and evaluate) on
Keras's JAX backend, in a process of their own (a process has one backend)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("jax")


# One process (a JAX start-up costs more than the tests it would share). (The baselines'
# numpy checks in tests/search build whole models: they run on TensorFlow only; on JAX the
# contract covers every search stage.) The models' suite runs without its docstring
# examples, numpy-only checks, DIN's loss (DARE's covers the composition) and the layers'
# configs (backend-independent: the TensorFlow run checks them).
@pytest.mark.slow
def test_layers_and_models_on_jax():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/layers", "tests/search/test_contract.py", "tests/search/test_top_k.py",
                           "tests/test_keras_models.py", "-k", "not docstring_examples and not prediction_head and "
                           "not sample_weights and not every_layer_serializes and not numpy[din]"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
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
    start-up lines (oneDNN, no CUDA driver) that the programs filter; `dare_tf.quiet()` first (the
    README's snippet) filters them too, and leaves other output alone."""
    import subprocess
    import sys

    from tests.conftest import LOUD_ENV, REPO

    script = ("import dare_tf; dare_tf.quiet()\nimport keras, sys\n"
              "dare_tf.build_model('dare', num_items=100, num_categories=10, max_len=20)\n"
              "print('to stderr', file=sys.stderr)\n")
    loud = subprocess.run([sys.executable, "-c", script.replace("dare_tf.quiet()", "pass")], cwd=REPO,
                          env=dict(LOUD_ENV, KERAS_BACKEND="tensorflow"), capture_output=True, text=True, timeout=300)
    assert "oneDNN custom operations are on" in loud.stderr  # (what it hides, on this machine)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=dict(LOUD_ENV, KERAS_BACKEND="tensorflow"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr.splitlines() == ["to stderr"], done.stderr
