"""tensorflow-recommenders needs `tf.keras` to be Keras 2 (tf-keras); the rest of
dare_tf uses Keras 3 (`import keras`). Both work in one process when
`TF_USE_LEGACY_KERAS=1` is set before anything resolves `tf.keras`."""

from __future__ import annotations

import os
import types


def require_keras2():
    """Makes `tf.keras` resolve to tf-keras (Keras 2) and returns `tf_keras`;
    raises `RuntimeError` naming the fix when `tf.keras` already resolved to
    Keras 3 in this process."""
    import tensorflow as tf

    current = tf.__dict__.get("keras")
    if getattr(current, "_tfll_initialized", None) is False:  # TF's lazy loader, not resolved yet
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    elif isinstance(current, types.ModuleType):  # resolved: the loader replaced itself with the module
        if not current.__name__.startswith("tf_keras"):
            raise RuntimeError(
                "dare_tf.retrieval needs tf.keras to be Keras 2 (tf-keras) for tensorflow-recommenders, but "
                f"tf.keras already resolved to Keras 3 ({current.__name__}) in this process. Set "
                "TF_USE_LEGACY_KERAS=1 in the environment, or import dare_tf.retrieval before any code "
                "touches tf.keras (`import keras` alone is fine)")
    import tf_keras

    return tf_keras
