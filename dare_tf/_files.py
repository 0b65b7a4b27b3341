"""Directories written aside and renamed into place, and the cleanup of what a
killed writer left behind. Private to dare_tf."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import uuid

import numpy as np


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def lock_holder(recorded: str) -> str:
    """A lock's holder as a refusal names it: what the holder recorded (`pid N`, or
    `pid N: what`), or `pid unknown` where a process that records nothing holds it
    (another program's `flock`)."""
    recorded = recorded.strip()
    if not recorded:
        return "pid unknown"
    return recorded if recorded.startswith("pid ") else f"pid {recorded}"


def staging_dir(parent: str, name: str) -> str:
    """Creates and returns `parent/.NAME.tmp-PID-RANDOM`: a directory this process
    builds before renaming it into place. Its name records the owner's pid, so a
    later run can tell a killed writer's leftovers from a live one's."""
    path = os.path.join(parent, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


@contextlib.contextmanager
def one_writer(target: str, what: str):
    """Holds the one writer's lock of directory `target` while the block runs, or
    raises ValueError naming the writer that holds it. The lock is the file
    `.NAME.lock` beside `target` (a writer that replaces `target` by a rename
    keeps it), taken with `flock`: released when its holder exits, killed too,
    and removed by a holder that ends (a lock file that was removed while
    another process waited for it is not taken: the path must still be it).
    `what` (`data.prepare`, `data.prepare --append`) is recorded for the
    refusal of the next one."""
    target = os.path.realpath(target)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    path = os.path.join(parent, f".{os.path.basename(target)}.lock")
    while True:
        lock = open(path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock_holder(lock.read())
            lock.close()
            raise ValueError(f"{what}: another writer is changing {target} ({holder}); one writer at a time: wait "
                             "for it to end") from None
        try:
            if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()  # (its holder removed it as we opened it: take the new one)
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}: {what}")
        lock.flush()
        yield
    finally:
        os.remove(path)  # (still held: a writer that opened it meanwhile finds it gone and opens anew)
        lock.close()


def clean_stale(parent: str, name: str) -> list[str]:
    """Removes `.NAME.tmp-PID-*` and `.NAME.old-PID-*` entries of `parent` whose
    process is gone (left by a killed run of the same program); returns them.
    Entries of live processes and everything else are left alone."""
    pattern = re.compile(rf"\.{re.escape(name)}\.(tmp|old)-(\d+)-[0-9a-f]{{8}}")
    removed = []
    if not os.path.isdir(parent):
        return removed
    for entry in sorted(os.listdir(parent)):
        match = pattern.fullmatch(entry)
        if match and int(match.group(2)) != os.getpid() and not _pid_alive(int(match.group(2))):
            path = os.path.join(parent, entry)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
            removed.append(path)
    return removed


def replace_directory(staging: str, target: str) -> None:
    """Moves a finished `staging` directory to `target`, replacing an old one by
    renames, so `target` never holds a mix of old and new files. The caller has
    checked that an existing `target` may be replaced."""
    old = None
    if os.path.exists(target):
        old = os.path.join(os.path.dirname(target),
                           f".{os.path.basename(target)}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    os.rename(staging, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def json_safe(value):
    """`value` as standard JSON can hold it: numpy numbers as Python numbers, and a
    NaN or infinite number (GAUC of a log without any user of both labels, a
    diverged loss) as null, which every JSON parser reads (a bare NaN is not JSON)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a numpy scalar or 0-d array
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def strict_json(payload, **kwargs) -> str:
    """`json.dumps` of `json_safe(payload)`, refusing anything that is not standard JSON."""
    return json.dumps(json_safe(payload), allow_nan=False, **kwargs)


def atomic_json(path: str, payload) -> None:
    """Writes standard JSON (`strict_json`) to `path` through a temporary file and a rename."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(strict_json(payload, indent=2, sort_keys=True))
    os.replace(tmp, path)


def atomic_npz(path: str, arrays: dict) -> None:
    """Writes `arrays` as `path` (`.npz`): to a temporary file beside it
    (`PATH.tmp-PID.npz`) that is fsynced, then renamed, the directory fsynced after:
    a reader sees the whole file or none, after a crash too."""
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


# Beside the arrays themselves: HDF5 / checkpoint metadata, a SavedModel's graph
# (1.2 MB for the demo's ranker), a file system's blocks.
SPACE_MARGIN = (1.1, 4 << 20)


def variables_bytes(variables) -> int:
    """The bytes of `variables`' values (Keras or TensorFlow variables; a
    Keras 2 optimizer's `variables` method)."""
    variables = variables() if callable(variables) else variables
    return sum(math.prod(int(d) for d in v.shape) * np.dtype(getattr(v.dtype, "name", v.dtype)).itemsize
               for v in variables)


def require_space(directory: str, need: int, what: str) -> None:
    """Refuses (OSError ENOSPC, one line) to write `what` of about `need` bytes
    into `directory` when its file system has less free: a write that runs out
    of space midway can crash a writer (h5py segfaults) instead of failing."""
    import errno

    os.makedirs(directory, exist_ok=True)
    free = shutil.disk_usage(directory).free
    need = int(need * SPACE_MARGIN[0]) + SPACE_MARGIN[1]
    if free < need:
        error = OSError(f"{directory}: {free / 2**20:.1f} MiB free, but {what} needs about {need / 2**20:.1f} MiB; "
                        "free some space and run it again")
        error.errno = errno.ENOSPC
        raise error


def describe_entries(directory: str, limit: int = 5) -> str:
    """`'a.txt', 'b/' and 3 more` for error messages."""
    entries = sorted(os.listdir(directory))
    shown = [f"'{e}/'" if os.path.isdir(os.path.join(directory, e)) else f"'{e}'" for e in entries[:limit]]
    more = f" and {len(entries) - limit} more" if len(entries) > limit else ""
    return ", ".join(shown) + more


class OutputDirError(ValueError):
    """A program refused an output directory (it would change what it did not write)."""


def guard_output_dir(output_dir: str, own, writer: str, inputs: dict[str, str] | None = None,
                     unclaimed: str | None = None) -> None:
    """The output-directory guard of every program that replaces or fills a
    directory of its own (data preparation, the analysis suite): raises
    `OutputDirError` unless `output_dir` is absent, an empty directory, or a
    directory whose every entry `own(entry)` claims, and unless it contains none
    of the `inputs` (what -> path: "the input log" -> the path the program reads). `writer` names the program in the
    message; `unclaimed` (what the directory would be were it the program's, e.g.
    "a dataset prepared by dare_tf") words the refusal of a directory of which
    nothing is claimed. (A run directory, `dare_tf.run_directory`, keeps the
    same promise by another route: `--overwrite` removes only its own entries.)"""
    real = os.path.realpath(output_dir)
    for what, path in (inputs or {}).items():
        source = os.path.realpath(path)
        if os.path.commonpath([real, source]) == real:
            raise OutputDirError(f"--output_dir={real} contains {what} {source}; "
                                 f"choose a directory of its own for the output of {writer}")
    if not os.path.lexists(output_dir):
        return
    if not os.path.isdir(output_dir):
        raise OutputDirError(f"--output_dir={real} exists and is not a directory; remove it or choose another path")
    entries = sorted(os.listdir(output_dir))
    foreign = [e for e in entries if not own(e)]
    if not foreign:
        return
    if unclaimed is not None and len(foreign) == len(entries):
        raise OutputDirError(f"--output_dir={real} is not empty and is not {unclaimed}; it holds "
                             f"{describe_entries(output_dir)}. Refusing to replace it: choose an empty or new "
                             "directory")
    raise OutputDirError(f"--output_dir={real} holds files {writer} did not write: "
                         f"{', '.join(repr(e) for e in foreign[:5])}"
                         f"{f' and {len(foreign) - 5} more' if len(foreign) > 5 else ''}. "
                         "Refusing to change it: move them away or choose another directory")


def file_sha256(path: str) -> str:
    """The sha256 (hex) of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
