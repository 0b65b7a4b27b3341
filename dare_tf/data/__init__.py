"""Data: the example schema and dataset spec, readers of any click or
impression log, the paper's preparation protocol (in memory and on Apache
Beam), the TFRecord shards, the sequence store, the synthetic log
generator, and the tf.data pipeline.

Each name is imported from its module on first use: `spec` is pure Python;
the pipeline needs TensorFlow, preparation numpy and pyarrow only.
"""

from dare_tf._faces import face_of, lazy_face

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__))
