"""`python tests/no_tensorflow.py MODULE ARGS...`: runs `python -m MODULE ARGS...` in a
process where importing TensorFlow fails (ImportError naming the module that
asked), so a test proves a program never loads it (the trainer on JAX)."""

import runpy
import sys


class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError(f"{name} imported where TensorFlow must not be")


if __name__ == "__main__":
    sys.meta_path.insert(0, _NoTensorFlow())
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
