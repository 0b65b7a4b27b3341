"""Resuming from the newest checkpoint that reads, on either backend: a damaged
newest one (a disk that filled, a copy cut short) is named and passed over for
the older one kept beside it; where none reads, one line names each. A run over
several processes, each keeping its own, resumes at the newest step that every
one holds and reads (`restore_newest_held`, `EveryProcess`). And the
JAX engine's checkpoints (`JaxCheckpoints`: numpy archives, no JAX needed to
read them)."""

from __future__ import annotations

import glob
import os
import re
import threading
import zipfile

from collections.abc import Callable, Iterable

import numpy as np

from dare_tf._faces import public
from dare_tf._files import atomic_npz


@public("dare_tf.training")
class DamagedCheckpointError(ValueError):
    """A checkpoint that cannot be read whole (the message names the file and what failed)."""


def restore_newest(paths: Iterable[str], restore: Callable[[str], object], say: Callable[[str], None] | None):
    """`restore(path)` of the first of `paths` (newest first) that does not raise
    `DamagedCheckpointError`, `say`ing which it passed over; None where `paths` is
    empty; the error, naming every file, where each is damaged."""
    damaged = []
    for path in paths:
        try:
            restored = restore(path)
        except DamagedCheckpointError as e:
            damaged.append(str(e))
            continue
        for line in damaged:
            if say is not None:
                say(f"warning: {line}; resuming from the older {os.path.basename(path)}")
        return restored
    if damaged:
        raise DamagedCheckpointError(" and ".join(damaged) + ": no checkpoint to resume from (remove them to "
                                     "start the seed again)")
    return None


@public("dare_tf.training")
class JaxCheckpoints:
    """`directory/ckpt-<step>.npz`: the values of a run's variables (model and
    optimizer, in order, each named by its path and checked by shape on restore)
    and a few scalars; written in the background to a temporary file that is
    fsynced, then renamed (the directory fsynced after), the newest `keep` kept.
    The temporary files a killed writer left are removed when the directory is
    opened (one writer per run: the run directory's lock); `restore_latest`
    falls back from a damaged newest checkpoint to the older one kept beside it."""

    PATTERN = re.compile(r"ckpt-(\d+)\.npz$")
    TEMPORARY = "ckpt-*.npz.tmp-*.npz"

    def __init__(self, directory: str, keep: int = 2):
        self.directory, self.keep = directory, keep
        self._writer: threading.Thread | None = None
        os.makedirs(directory, exist_ok=True)
        for leftover in glob.glob(os.path.join(directory, self.TEMPORARY)):
            os.remove(leftover)

    def _steps(self) -> list[int]:
        found = (self.PATTERN.search(p) for p in glob.glob(os.path.join(self.directory, "ckpt-*.npz")))
        return sorted(int(m.group(1)) for m in found if m)

    def save(self, step: int, variables: list, **scalars) -> str:
        """Copies the values to the host and writes them in a thread of its own
        (training goes on meanwhile; the next `save` or `wait` waits for it)."""
        self.wait()
        path = os.path.join(self.directory, f"ckpt-{step}.npz")
        arrays = {f"v{i}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
        arrays["names"] = np.array([v.path for v in variables])
        arrays.update({f"s_{k}": np.asarray(v, np.float64) for k, v in scalars.items()})
        self._writer = threading.Thread(target=self._write, args=(path, arrays), daemon=False)
        self._writer.start()
        return path

    def _write(self, path: str, arrays: dict) -> None:
        atomic_npz(path, arrays)
        for old in self._steps()[: -self.keep]:
            os.remove(os.path.join(self.directory, f"ckpt-{old}.npz"))

    def wait(self) -> None:
        """Until the last checkpoint is on disk."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    @staticmethod
    def read(path: str) -> tuple[list[str], list[np.ndarray], dict]:
        """A checkpoint's variable names, values and scalars; `DamagedCheckpointError`
        (one line naming the file) where it cannot be read whole."""
        if not zipfile.is_zipfile(path):  # (cut short, empty, other bytes: numpy's own errors would not say so)
            raise DamagedCheckpointError(f"{path}: not a readable checkpoint (not an .npz archive: "
                                         f"{os.path.getsize(path)} bytes)")
        try:
            with np.load(path, allow_pickle=False) as data:
                names = [str(n) for n in data["names"]]
                values = [data[f"v{i}"] for i in range(len(names))]
                scalars = {k[2:]: data[k].item() for k in data.files if k.startswith("s_")}
        except Exception as e:  # noqa: BLE001 (a damaged member, a missing key: the file is damaged alike)
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DamagedCheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {reason})") from e
        return names, values, scalars

    def restore(self, path: str, variables: list) -> dict:
        """Assigns the checkpoint's values to `variables` (none of them unless every
        value reads and fits); returns its scalars."""
        names, values, scalars = self.read(path)
        if len(names) != len(variables):
            raise ValueError(f"{path}: holds {len(names)} variables; the run's model and optimizer have "
                             f"{len(variables)}: it is another model's checkpoint")
        for name, value, variable in zip(names, values, variables, strict=True):
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(f"{path}: variable {name} has shape {value.shape}; the run's "
                                 f"{variable.path} has {tuple(variable.shape)}")
        for value, variable in zip(values, variables, strict=True):
            variable.assign(value)
        return scalars

    def restore_latest(self, variables: list, say: Callable[[str], None], processes=None) -> dict | None:
        """The newest readable checkpoint's scalars, its values assigned
        (`restore_newest_held`; `processes`: a run over several processes)."""
        return restore_newest_held(self._steps(), lambda step: os.path.join(self.directory, f"ckpt-{step}.npz"),
                                   lambda path: self.restore(path, variables), say, processes)


class EveryProcess:
    """What every process of a run over several processes holds (each with its own
    checkpoints): `common(steps)` and `all(ok)`, which every process calls at the
    same point of the run, over the engine's collectives (`_gathered`)."""

    def _gathered(self, values: np.ndarray) -> np.ndarray:
        """`[processes, len(values)]`: each process's `values` (int32, one length in all)."""
        raise NotImplementedError

    def common(self, values: list[int]) -> list[int]:
        """The sorted `values` that every process's list holds (non-negative integers)."""
        width = int(self._gathered(np.array([len(values)], np.int32)).max())
        padded = np.full(max(width, 1), -1, np.int32)
        padded[: len(values)] = values
        held = set.intersection(*(set(row.tolist()) for row in self._gathered(padded)))
        return sorted(held - {-1})

    def all(self, ok: bool) -> bool:
        """Whether `ok` is true in every process."""
        return bool(self._gathered(np.array([int(ok)], np.int32)).min())


def restore_newest_held(steps: list[int], path_of: Callable[[int], str], restore: Callable[[str], object],
                        say: Callable[[str], None] | None, processes: EveryProcess | None = None):
    """`restore_newest` over the checkpoints of `steps` (ascending; `path_of(step)`).

    `processes` (a run over several processes, each with its own checkpoints): the
    newest step that every process holds and reads, so that all resume at one step,
    whichever of them ended before writing its newest (their collectives would no
    longer match); a step another process cannot read is passed over by every one."""
    common = steps if processes is None else processes.common(steps)
    paths = [path_of(step) for step in reversed(common)]
    if processes is None:
        return restore_newest(paths, restore, say)
    if steps and steps[-1] not in common and say is not None:
        say(f"warning: {path_of(steps[-1])}: not every process of the run holds step {steps[-1]} (one ended "
            f"before writing it); resuming from {os.path.basename(paths[0]) if paths else 'the start'}")

    def agreed(path: str):
        try:
            restored, damaged = restore(path), None
        except DamagedCheckpointError as e:
            restored, damaged = None, e
        if not processes.all(damaged is None):
            raise damaged or DamagedCheckpointError(f"{path}: another process of the run cannot read its "
                                                    "checkpoint of this step")
        return restored

    return restore_newest(paths, agreed, say)


__all__ = ["DamagedCheckpointError", "EveryProcess", "JaxCheckpoints", "restore_newest", "restore_newest_held"]
