"""Generating logs: planted and lifelong synthetic logs (`synthetic`) and logs
like Taobao's and Tmall's at their real size (`lifelike`)."""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("lifelike", "synthetic")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
