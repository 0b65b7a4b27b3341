"""Data: the example schema and dataset spec, readers of any click or
impression log, the paper's preparation protocol (in memory and on Apache
Beam), the TFRecord shards, the sequence store, the synthetic log
generator, and the tf.data pipeline.

`spec` is pure Python; everything else needs TensorFlow (or pyarrow) and is
imported on first use.
"""

import importlib

from dare_tf.data.spec import (FORMAT, MODEL_INPUTS, SCALAR_FEATURES, SEQUENCE_FEATURES, SPLITS,
                               DatasetSpec, id_map_digest, read_id_map)

_LAZY = {
    "make_dataset": "dare_tf.data.pipeline",
    "SequenceStore": "dare_tf.data.store",
    "read_examples": "dare_tf.data.store",
    "prepare_beam": ("dare_tf.data.beam", "prepare"),
    "InMemorySplit": "dare_tf.data.pipeline",
    "Protocol": "dare_tf.data.protocol",
    "prepare": "dare_tf.data.protocol",
    "BadLineError": "dare_tf.data.logs",
    "LogFormat": "dare_tf.data.logs",
    "ShardError": "dare_tf.data.records",
    "SyntheticConfig": "dare_tf.data.synthetic",
    "write_synthetic": ("dare_tf.data.synthetic", "write"),
}

__all__ = ["FORMAT", "MODEL_INPUTS", "SCALAR_FEATURES", "SEQUENCE_FEATURES", "SPLITS", "DatasetSpec",
           "id_map_digest", "read_id_map", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        module, attribute = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'dare_tf.data' has no attribute {name!r}")
