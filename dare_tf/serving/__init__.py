"""Serving (TensorFlow only): the gRPC/REST client and the two-stage
`Recommender` (retrieval, then ranking); `export_saved_model` and `export_run`
are `dare_tf.export`'s. The stand-in server the tests and the demo use is a
test double in `dare_tf.testing`, not public API.
"""

from dare_tf._faces import face_of, lazy_face

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__))
