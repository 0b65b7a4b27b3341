"""The trainer's entry, `train`, on either backend: Keras's TensorFlow backend
(`dare_tf.training.loop`, tf.data and tf.distribute) or its JAX backend
(`dare_tf.training.jax_loop`, with no TensorFlow). Importing it loads neither."""

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
    configuration's `tf.distribute` strategy (`dare_tf.training.loop`); on JAX
    with no TensorFlow, under its `keras.distribution` (`dare_tf.training.jax_loop`):
    the backend is Keras's, chosen once (`KERAS_BACKEND`).

    `report` receives the progress lines (`verbose` 1 and 2); `flags_text`, the
    program's effective flags, is written to `output_dir/flags.txt` (a flagfile
    that reproduces the run), less those of the other engine (`--cpu_devices` and
    `--jit_compile` on JAX, `--compilation_cache` on TensorFlow)."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        from dare_tf.training.jax_loop import train_on_jax as engine
    elif backend == "tensorflow":
        from dare_tf.training.loop import train_on_tensorflow as engine
    else:
        raise ValueError(f"the trainer runs on Keras's TensorFlow or JAX backend; KERAS_BACKEND is {backend!r}: "
                         "set it to jax or unset it, or train with DareModel's own compile/fit on that backend "
                         "(docs/library.md)")
    if flags_text is not None:
        from dare_tf.training.program_flags import read_by

        flags_text = read_by(backend, flags_text)
    return engine(data_dir, output_dir, config, overwrite, report, flags_text)
