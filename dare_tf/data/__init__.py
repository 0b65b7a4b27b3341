"""Data: the example schema and dataset spec, readers of any click or
impression log, the paper's preparation protocol (in memory and on Apache
Beam), the TFRecord shards, the sequence store, the synthetic log
generator, and the tf.data pipeline.

Each name is imported from its module on first use: `spec` is pure Python;
the pipeline needs TensorFlow, preparation numpy and pyarrow only.
"""

from dare_tf._faces import lazy_face

# Public name -> the module that defines it (or (module, name there)), imported on first use.
_LAZY = {
    **dict.fromkeys(("FORMAT", "MODEL_INPUTS", "SCALAR_FEATURES", "SEQUENCE_FEATURES", "SPLITS", "DatasetSpec",
                     "id_map_digest", "read_id_map"), "dare_tf.data.spec"),
    "item_categories": "dare_tf.data.prepared",
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

__getattr__, __dir__, __all__ = lazy_face(__name__, _LAZY)
