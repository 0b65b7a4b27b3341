"""Serving (TensorFlow only): the gRPC/REST client and the two-stage
`Recommender` (retrieval, then ranking); `export_saved_model` and `export_run`
are `dare_tf.export`'s. The stand-in server the tests and the demo use is a
test double in `dare_tf.testing`, not public API.
"""

from dare_tf._faces import lazy_face

_LAZY = {
    "export_saved_model": "dare_tf.export",
    "export_run": "dare_tf.export",
    "ServingClient": "dare_tf.serving.client",
    "make_example": "dare_tf.serving.client",
    "pad_histories": "dare_tf.serving.client",
    "rest_predict": "dare_tf.serving.client",
    "explained_behaviours": "dare_tf.serving.client",
    "format_explanation": "dare_tf.serving.client",
    "Recommender": "dare_tf.serving.cascade",
    "LocalModel": "dare_tf.serving.cascade",
    "format_recommendations": "dare_tf.serving.cascade",
}

__getattr__, __dir__, __all__ = lazy_face(__name__, _LAZY)
