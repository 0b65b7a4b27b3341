"""Serving (TensorFlow only): SavedModel export for TensorFlow Serving, raw-id
maps, the gRPC/REST client, and the two-stage `Recommender` (retrieval, then
ranking). `standin_server` is a test and demo double of
TensorFlow Serving, not a server to deploy.
"""

import importlib

_LAZY = {
    "export_saved_model": "dare_tf.serving.export",
    "export_run": "dare_tf.serving.export",
    "ServingClient": "dare_tf.serving.client",
    "make_example": "dare_tf.serving.client",
    "pad_histories": "dare_tf.serving.client",
    "rest_predict": "dare_tf.serving.client",
    "Recommender": "dare_tf.serving.cascade",
    "LocalModel": "dare_tf.serving.cascade",
    "format_recommendations": "dare_tf.serving.cascade",
    "read_model_config": "dare_tf.serving.standin_server",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dare_tf.serving' has no attribute {name!r}")
