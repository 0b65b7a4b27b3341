"""Feeding training: the tf.data pipeline, streamed and in memory (`pipeline`),
and the training negatives drawn per epoch (`negatives`)."""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("negatives", "pipeline")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
