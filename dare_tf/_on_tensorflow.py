"""What only Keras's TensorFlow backend does, asked of a child process on it by a
process on another backend (the trainer's JAX engine, `KERAS_BACKEND=jax`):
a SavedModel's export (its signatures are TensorFlow functions) and the
analyses' split gradients (TensorFlow's gradient tapes). The run directories
they read hold weights any backend loads. Private to dare_tf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable

# The child: `function(*args)` of `module`, its JSON result the last line it prints.
_CHILD = ("import importlib, json, sys; module, name, args = json.loads(sys.argv[1]); "
          "print(json.dumps(getattr(importlib.import_module(module), name)(*args)))")


def on_tensorflow(module: str, name: str, args: list, what: str, say: Callable[[str], None] | None = None,
                  **here):
    """`module.name(*args)` on Keras's TensorFlow backend: called here where this process
    runs on it (with the keyword arguments `here` too: objects a child cannot be
    handed), else in a child process on it (JSON in, JSON out; this checkout on its
    path), the child's other output lines going to `say` as they come.
    `ChildProcessError` (an `OSError`: a program's one-line error) with the child's
    last line where it fails (TensorFlow not installed: `ModuleNotFoundError: No
    module named 'tensorflow'`)."""
    import importlib

    import keras

    if keras.backend.backend() == "tensorflow":
        return getattr(importlib.import_module(module), name)(*args, **here)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryFile("w+") as stderr:  # (a file, not a pipe: a child's long stderr cannot block it)
        child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps([module, name, args])], env=env,
                                 stdout=subprocess.PIPE, stderr=stderr, text=True)
        lines = []
        for line in child.stdout:
            if lines and say is not None:
                say(lines[-1])
            lines.append(line.rstrip("\n"))
        child.wait()
        stderr.seek(0)
        errors = stderr.read()
    if child.returncode:
        last = (errors.strip().splitlines() or ["(no output)"])[-1]
        raise ChildProcessError(f"{what} runs on Keras's TensorFlow backend, in a process of its own, which failed: "
                           f"{last}")
    return json.loads(lines[-1])
