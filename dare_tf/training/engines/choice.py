"""Which engine runs a training: the one of Keras's backend."""

from __future__ import annotations

from typing import Callable


def backend() -> str:
    """The backend Keras runs on (`KERAS_BACKEND`, chosen once per process)."""
    import keras

    return keras.backend.backend()


def engine_train(name: str | None = None) -> Callable:
    """The engine's `train_on_<backend>(data_dir, output_dir, config, overwrite,
    report, flags_text)` for the backend `name` (default: Keras's); importing
    it loads only that engine's library."""
    name = backend() if name is None else name
    if name == "jax":
        from dare_tf.training.engines.jax.loop import train_on_jax

        return train_on_jax
    if name == "tensorflow":
        from dare_tf.training.engines.tensorflow.loop import train_on_tensorflow

        return train_on_tensorflow
    raise ValueError(f"the trainer runs on Keras's TensorFlow or JAX backend; KERAS_BACKEND is {name!r}: "
                     "set it to jax or unset it, or train with DareModel's own compile/fit on that backend "
                     "(docs/library.md)")
