"""tensorflow-recommenders needs `tf.keras` to be Keras 2 (tf-keras); the rest of
dare_tf uses Keras 3 (`import keras`). Both work in one process when
`TF_USE_LEGACY_KERAS=1` is set before anything resolves `tf.keras`: the one
switch, `use_keras2`, which the programs call before TensorFlow loads and a
user's own script calls the same way. Importing a dare_tf module never sets it."""

from __future__ import annotations

import os
import sys
import types

from dare_tf._faces import public

_FIX = ("call dare_tf.retrieval.use_keras2() before anything touches tf.keras (`import keras` alone is fine), "
        "or set TF_USE_LEGACY_KERAS=1 in the environment")


def _resolved_keras() -> str | None:
    """What `tf.keras` resolved to in this process (`"tf_keras"` or the Keras 3
    module's name), or None while TensorFlow's lazy loader has not resolved it
    (or TensorFlow is not imported). Reads `__dict__`s only: resolves nothing."""
    tf = sys.modules.get("tensorflow")
    current = None if tf is None else tf.__dict__.get("keras")
    if not isinstance(current, types.ModuleType):
        return None
    state = current.__dict__
    if "_tfll_initialized" in state:  # TensorFlow's KerasLazyLoader
        if not state["_tfll_initialized"]:
            return None
        return "tf_keras" if state.get("_tfll_keras_version") == "tf_keras" else "keras 3"
    return "tf_keras" if current.__name__.startswith("tf_keras") else current.__name__


@public("dare_tf.retrieval")
def use_keras2() -> None:
    """Makes `tf.keras` resolve to tf-keras (Keras 2) in this process: sets
    `TF_USE_LEGACY_KERAS=1`. Refuses (RuntimeError) when `tf.keras` already
    resolved to Keras 3 here."""
    current = _resolved_keras()
    if current not in (None, "tf_keras"):
        raise RuntimeError(f"tf.keras already resolved to Keras 3 ({current}) in this process: {_FIX}")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


def require_keras2():
    """`tf_keras`, when `tf.keras` is or will be Keras 2 (`use_keras2`); otherwise
    RuntimeError naming the fix. Changes nothing."""
    current = _resolved_keras()
    if current is not None:
        ok = current == "tf_keras"
    else:
        ok = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
    if not ok:
        raise RuntimeError(f"dare_tf.retrieval needs tf.keras to be Keras 2 (tf-keras) for tensorflow-recommenders: "
                           f"{_FIX}")
    import tf_keras

    return tf_keras
