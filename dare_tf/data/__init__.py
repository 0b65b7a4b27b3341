"""Data, one subpackage per job:

- `logs`: reading any click or impression log (formats, readers, times, string ids);
- `storage`: a prepared dataset on disk (the example schema, shards, `spec.json`,
  the TFRecord records, the sequence store);
- `preparation`: the paper's protocol in memory and on Apache Beam, the time split
  by days and appending a day;
- `feeding`: the tf.data pipeline and drawn training negatives;
- `generation`: synthetic logs, and logs like Taobao's and Tmall's at their real size.

Each public name is imported from its module on first use: `storage.spec` is pure
Python; the pipeline needs TensorFlow, preparation numpy and pyarrow only.
"""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("feeding", "generation", "logs", "preparation", "storage")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
