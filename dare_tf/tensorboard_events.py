"""A run's TensorBoard event files (`ScalarWriters`), written with the tensorboard
package's own writer: any backend writes them without TensorFlow. The trainer's
`TensorBoardScalars` callback, its seeds' test metrics and hyperparameters, and the
retrieval stage's test recall write through it."""

from __future__ import annotations

import os
import time

from dare_tf._faces import public


def _tensorboard_without_tensorflow() -> None:
    """Where this process has not loaded TensorFlow (the JAX engine), the tensorboard
    package's writer uses its own file layer (`tensorboard.compat.tensorflow_stub`), not
    TensorFlow's: by default it imports TensorFlow wherever installed (measured: 2.6 s
    of a 20-step JAX run's 8.5, and TensorFlow's start-up notices in its output). The
    marker module is TensorBoard's own switch (`tensorboard.compat.tf`: `notf`)."""
    import sys
    import types

    if "tensorflow" not in sys.modules and "tensorboard.compat.notf" not in sys.modules:
        sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")


@public("dare_tf.training")
class ScalarWriters:
    """TensorBoard event files under `log_dir`, a run (`train`, `validation`, `test`) a
    directory, each `write` flushed; `tf.summary.scalar`'s protos by the tensorboard
    package's writer: any backend writes them without TensorFlow. `close()` (or the
    `with` block's end) closes the files and ends their writers' threads: a process
    that trains many runs holds none of them open (a later `write` opens a new file)."""

    def __init__(self, log_dir: str):
        self.log_dir, self.writers = log_dir, {}

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()

    def __enter__(self) -> "ScalarWriters":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _event(self, name: str, summary, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        if name not in self.writers:
            _tensorboard_without_tensorflow()
            self.writers[name] = EventFileWriter(os.path.join(self.log_dir, name) if name else self.log_dir)
        self.writers[name].add_event(Event(wall_time=time.time(), step=step, summary=summary))
        self.writers[name].flush()

    def write(self, name: str, values: dict, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        self._event(name, Summary(value=[scalar_pb(tag, float(v)).value[0] for tag, v in values.items()]), step)

    def hparams(self, hp: dict) -> None:
        """The run's hyperparameters (HParams plugin) in `log_dir`'s own file; lists, None as text."""
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        self._event("", hparams_pb({k: v if isinstance(v, (int, float, str)) else f"{v}" for k, v in hp.items()}), 0)
