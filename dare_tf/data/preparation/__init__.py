"""Preparing a log: the paper's protocol and the in-memory driver (`protocol`,
`examples`), the time split by days (`days`) and appending a day (`append`),
the Apache Beam driver (`beam`, `beam_exchange`, `beam_statistics`), and the dataset's files and
directory (`prepared`, `dataset_dir`). Writes what `dare_tf.data.storage`
reads."""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("append", "beam", "beam_exchange", "beam_statistics", "dataset_dir", "days", "examples", "prepared",
               "protocol")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
