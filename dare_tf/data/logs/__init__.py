"""Reading any log: its format (`formats`: columns, presets, actions, the field
columns), the readers of CSV, TSV and Parquet click or impression logs in blocks
(`reader`, `parquet`), times as Unix seconds (`times`) and string ids
(`string_ids`). numpy and pyarrow only; no other part of `dare_tf.data` is
imported here."""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("formats", "parquet", "reader", "string_ids", "times")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
