"""The trainer's entry, `train`, on either backend: Keras's TensorFlow backend
(`dare_tf.training.loop`, tf.data and tf.distribute) or its JAX backend
(`dare_tf.training.jax_loop`, with no TensorFlow). Importing it loads neither."""

from __future__ import annotations

from typing import Callable

from dare_tf._faces import public
from dare_tf.training.config import TrainConfig


@public("dare_tf.training")
def train(data_dir: str, output_dir: str, config: TrainConfig, strategy=None, overwrite: bool = False,
          report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """Trains every seed of `config` (resuming or reusing finished ones) and
    writes `output_dir/results.json`; returns its content. On Keras's TensorFlow
    backend under `strategy` (a `tf.distribute` strategy; default: the
    configuration's, `dare_tf.training.loop`); on JAX with no TensorFlow, the
    configuration's `keras.distribution` (`dare_tf.training.jax_loop`).

    `report` receives the progress lines (`verbose` 1 and 2); `flags_text`, the
    program's effective flags, is written to `output_dir/flags.txt` (a flagfile
    that reproduces the run)."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        if strategy is not None:
            raise ValueError("a tf.distribute strategy was given to the trainer on JAX: pass none, and set "
                             "--strategy=data_parallel or model_parallel (keras.distribution)")
        from dare_tf.training.jax_loop import train_on_jax

        return train_on_jax(data_dir, output_dir, config, overwrite, report, flags_text)
    if backend != "tensorflow":
        raise ValueError(f"the trainer runs on Keras's TensorFlow or JAX backend; KERAS_BACKEND is {backend!r}: "
                         "set it to jax or unset it, or train with DareModel's own compile/fit on that backend "
                         "(docs/library.md)")
    from dare_tf.training.loop import train_on_tensorflow

    return train_on_tensorflow(data_dir, output_dir, config, strategy, overwrite, report, flags_text)
