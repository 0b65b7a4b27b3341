"""The repository's absl programs run inside the test's own process (`run_program`).

A program started as `python -m trainers.train ...` imports TensorFlow and Keras
first (about 5 s on the CI machine), which a test process has already done. Where
a test is about what a program does (its files, its output, its exit code), not
about the process itself (start-up notices, a kill, environment variables read
before TensorFlow loads, another Keras backend), `run_program` runs the program's
`run()` as `python -m` would, with its own argv, working directory, environment
(less what a process reads once: `PROCESS_WIDE`), standard input and output, and
gives back a `subprocess.CompletedProcess`.

Each call imports the program module afresh and then removes it with the flags it
defined, so programs that define flags of the same name run one after another;
the flags that stay (absl's, `--debug`) are reset to their defaults. Standard
output and error are captured at their file descriptors (what TensorFlow's C++
side prints too) and the logging handlers, signal handlers, working directory,
environment and Keras's dtype policy are restored afterwards.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import traceback

from absl import flags
from absl import logging as absl_logging

from tests.conftest import REPO

FLAGS = flags.FLAGS
PROGRAM_PACKAGES = ("data", "serving", "trainers")
# Environment variables read once per process: a program run here keeps this process's values.
PROCESS_WIDE = ("TF_USE_LEGACY_KERAS", "KERAS_BACKEND")
_BASE_FLAGS: set[str] = set()


def _is_program(name: str) -> bool:
    return name.partition(".")[0] in PROGRAM_PACKAGES and "." in name


def _forget_programs() -> None:
    """Removes every program module and the flags that are not the base set."""
    for name in [n for n in sys.modules if _is_program(n)]:
        del sys.modules[name]
    for name in [n for n in FLAGS if n not in _BASE_FLAGS]:
        delattr(FLAGS, name)
    FLAGS.unparse_flags()


def run_program(program: str, *args: str, cwd: str = REPO, env: dict | None = None,
                input: str | bytes | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`python -m program args...` in this process: `program`'s `run()` with
    `sys.argv` set, in `cwd`, with the environment `env` (default: this one),
    `input` as standard input; returns its exit code, stdout and stderr (text).
    `check`: an exit code other than 0 raises `AssertionError` with the output."""
    import importlib

    import dare_tf.cli  # noqa: F401 (its flags belong to the base set)
    from dare_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()  # (TensorFlow's start-up notices, once, before any program's output is read)
    import keras

    if not _BASE_FLAGS:
        _BASE_FLAGS.update(n for n in FLAGS if not any(
            _is_program(m) for m, fs in FLAGS.flags_by_module_dict().items() for f in fs if f.name == n))
    _forget_programs()
    # (the program's start freezes what is alive, `start_up_frozen`, and in this process, frozen since
    # the collection (tests/conftest.py), keeps it frozen: earlier tests' garbage is collected first)
    gc.collect()
    saved = {"cwd": os.getcwd(), "env": dict(os.environ), "argv": sys.argv, "stdin": sys.stdin,
             "stdout": sys.stdout, "stderr": sys.stderr, "policy": keras.config.dtype_policy(),
             "verbosity": absl_logging.get_verbosity(), "main_doc": sys.modules["__main__"].__doc__,
             "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}}
    handler = absl_logging.get_absl_handler().python_handler
    saved["log_stream"] = handler.stream
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as stdin:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        fds = {0: os.dup(0), 1: os.dup(1), 2: os.dup(2)}
        code = 0
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            stdin.write(input if isinstance(input, bytes) else (input or "").encode())
            stdin.seek(0)
            os.dup2(stdin.fileno(), 0)
            sys.stdin = open(0, "r", closefd=False)
            handler.stream = sys.stderr
            if env is not None:
                os.environ.clear()
                # (what this process resolved once stays: tf.keras's Keras, Keras's backend)
                os.environ.update(env, **{k: saved["env"][k] for k in PROCESS_WIDE if k in saved["env"]})
            os.chdir(cwd)
            module = importlib.import_module(program)
            sys.argv = [module.__file__, *args]
            try:
                module.run()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 (an uncaught exception: Python prints it and exits with 1)
                traceback.print_exc()
                code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            for fd, copy in fds.items():
                os.dup2(copy, fd)
                os.close(copy)
            sys.stdout, sys.stderr, sys.stdin, sys.argv = (saved["stdout"], saved["stderr"], saved["stdin"],
                                                           saved["argv"])
            handler.stream = saved["log_stream"]
            os.chdir(saved["cwd"])
            os.environ.clear()
            os.environ.update(saved["env"])
            keras.config.set_dtype_policy(saved["policy"])
            absl_logging.set_verbosity(saved["verbosity"])
            sys.modules["__main__"].__doc__ = saved["main_doc"]
            for number, action in saved["signals"].items():
                signal.signal(number, action)
            _forget_programs()
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess([sys.executable, "-m", program, *args], code,
                                           out.read().decode(errors="replace"), err.read().decode(errors="replace"))
    if check and code != 0:
        raise AssertionError(f"{program} {' '.join(args)} exited with {code}:\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


# The stand-in for `python` in a script run by `run_script`: sends its command line, working
# directory, environment and standard input to the test's process and prints what comes back.
_SHIM = r'''
import base64, json, os, socket, sys
stdin = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
request = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
           "stdin": base64.b64encode(stdin).decode()}
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["DARE_TF_PROGRAM_SOCKET"])
    s.sendall(json.dumps(request).encode() + b"\n")
    s.shutdown(socket.SHUT_WR)
    answer = json.loads(b"".join(iter(lambda: s.recv(1 << 16), b"")))
sys.stdout.write(answer["stdout"])
sys.stderr.write(answer["stderr"])
sys.exit(answer["code"])
'''


def run_script(script: str, cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Runs a bash `script` whose foreground `python -m PROGRAM ...` commands run in this
    process (`run_program`, each as that command would: its argv, working directory,
    environment, piped standard input, output and exit code); a command sent to the
    background (`... &`, a server) and every other `python` run as processes of their own."""
    import base64
    import json
    import re
    import select
    import socket
    import time

    folder = tempfile.mkdtemp(prefix="programs-")
    shim, address = os.path.join(folder, "shim.py"), os.path.join(folder, "socket")
    with open(shim, "w") as f:
        f.write(_SHIM)
    prelude = ('python() { if [ "${1:-}" = "-m" ]; then command python "$DARE_TF_PROGRAM_SHIM" "$@"; '
               'else command python "$@"; fi; }\n')
    lines = [re.sub(r"^(\s*)python ", r"\1command python ", line) if re.search(r"&\s*(#.*)?$", line) else line
             for line in script.splitlines()]
    env = dict(env, DARE_TF_PROGRAM_SOCKET=address, DARE_TF_PROGRAM_SHIM=shim)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    with socket.socket(socket.AF_UNIX) as server, out, err:
        server.bind(address)
        server.listen()
        bash = subprocess.Popen(["bash", "-c", prelude + "\n".join(lines) + "\n"], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            while bash.poll() is None:
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(bash.args, timeout)
                if not select.select([server], [], [], 0.1)[0]:
                    continue
                connection, _ = server.accept()
                with connection:
                    request = json.loads(b"".join(iter(lambda: connection.recv(1 << 16), b"")))
                    argv = request["argv"]  # ["-m", PROGRAM, args...]
                    done = run_program(argv[1], *argv[2:], cwd=request["cwd"], env=request["env"],
                                       input=base64.b64decode(request["stdin"]))
                    connection.sendall(json.dumps({"code": done.returncode, "stdout": done.stdout,
                                                   "stderr": done.stderr}).encode())
        finally:
            if bash.poll() is None:
                bash.kill()
            bash.wait()
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(bash.args, bash.returncode, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))
