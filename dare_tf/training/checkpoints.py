"""Resuming from the newest checkpoint that reads, on either backend: a damaged
newest one (a disk that filled, a copy cut short) is named and passed over for
the older one kept beside it; where none reads, one line names each."""

from __future__ import annotations

import os

from collections.abc import Callable, Iterable

from dare_tf._faces import public


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


__all__ = ["DamagedCheckpointError", "restore_newest"]
