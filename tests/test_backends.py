"""The backend-agnostic tests (layers, DareModel, its loss, fit and evaluate) on
Keras's JAX backend, in a process of their own (a process has one backend)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("jax")


@pytest.mark.slow
def test_layers_and_models_on_jax():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/layers", "tests/test_keras_models.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "tensorflow" not in done.stdout.lower().split("passed")[-1]
