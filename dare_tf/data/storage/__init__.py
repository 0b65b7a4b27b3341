"""A prepared dataset on disk: the features' and records' names (`schema`), the
shards' names and partitions (`shards`), `spec.json` and its id maps (`spec`),
the further fields' files and time-gap buckets (`fields`), the TFRecord shards
(`records`, their wire format `wire`) and the sequence store in memory
(`store`). Imports only `dare_tf.data.logs` (the action field's name)."""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("fields", "records", "schema", "shards", "spec", "store", "wire")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
