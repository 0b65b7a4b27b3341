"""The trainer's entry, `train`, on the engine of Keras's backend
(`dare_tf.training.engines`: TensorFlow's, tf.data and tf.distribute, or JAX's,
with no TensorFlow). Importing it loads neither."""

from __future__ import annotations

from typing import Callable

from dare_tf._faces import public
from dare_tf.training.config import TrainConfig


@public("dare_tf.training")
def train(data_dir: str, output_dir: str, config: TrainConfig, overwrite: bool = False,
          report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """Trains every seed of `config` (resuming or reusing finished ones) and
    writes `output_dir/results.json`; returns its content, with `chief`: whether
    this process is the run's first (the one that writes the run directory;
    always true in one process). On Keras's TensorFlow backend under the
    configuration's `tf.distribute` strategy; on JAX with no TensorFlow, under
    its `keras.distribution` (`dare_tf.training.engines`): the backend is
    Keras's, chosen once (`KERAS_BACKEND`).

    `report` receives the progress lines (`verbose` 1 and 2); `flags_text`, the
    program's effective flags, is written to `output_dir/flags.txt` (a flagfile
    that reproduces the run), less those of the other engine (`--cpu_devices` and
    `--jit_compile` on JAX, `--compilation_cache` on TensorFlow)."""
    from dare_tf.training.engines.choice import backend, engine_train

    name = backend()
    engine = engine_train(name)
    if flags_text is not None:
        from dare_tf.training.program_flags import read_by

        flags_text = read_by(name, flags_text)
    return engine(data_dir, output_dir, config, overwrite, report, flags_text)
