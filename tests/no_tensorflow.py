"""`python tests/no_tensorflow.py [--missing=PACKAGE ...] MODULE ARGS...`: runs
`python -m MODULE ARGS...` in a process where importing TensorFlow fails
(ImportError naming the module that asked), so a test proves a program never loads
it (the trainer on JAX), and each `--missing` package is absent as one not installed
(ModuleNotFoundError); `pytest_on_jax` runs tests that way on JAX."""

import os
import runpy
import sys


def pytest_on_jax(*args: str, optimized: bool = False):
    """`pytest ARGS...` (one process, no xdist) on Keras's JAX backend where importing
    TensorFlow fails, from the repository's root: the `subprocess.CompletedProcess`.
    `optimized`: XLA's optimisation passes on, which the tests' own processes leave
    off (tests/conftest.py), for tests that train for hundreds of steps."""
    import subprocess

    from tests.conftest import UNOPTIMIZED

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=root)
    if optimized:
        env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split() if flag != UNOPTIMIZED)
    return subprocess.run([sys.executable, os.path.abspath(__file__), "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "no:xdist", *args], cwd=root, env=env, capture_output=True, text=True, timeout=900)


class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError(f"{name} imported where TensorFlow must not be")


class _Missing:
    def __init__(self, package: str):
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name == self.package or name.startswith(self.package + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


if __name__ == "__main__":
    sys.meta_path.insert(0, _NoTensorFlow())
    args = sys.argv[1:]
    while args[0].startswith("--missing="):
        sys.meta_path.insert(0, _Missing(args.pop(0).split("=", 1)[1]))
    sys.argv = args
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
