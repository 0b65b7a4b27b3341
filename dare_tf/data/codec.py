"""Fast serialization of int64 `tf.train.Example` records, a batch at a time.

`tf.train.Example(...).SerializeToString()` costs ~60 us per record in Python,
and preparing a click log writes millions of records. `encode_int64_examples`
builds the same messages for a whole batch with TensorFlow's vectorised
`tf.io.encode_proto`, level by level (Int64List -> Feature -> map entry ->
Features -> Example), at ~10 us per record.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def _as_matrix(name: str, values) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim == 1:
        values = values[:, None]
    if values.ndim != 2 or values.shape[1] < 1:
        raise ValueError(f"encode_int64_examples: feature {name!r} must be [N] or [N, k>=1], "
                         f"got shape {values.shape}")
    return values


def _feature_entry(name: str, values: np.ndarray) -> tf.Tensor:
    """Serialized `Features.FeatureEntry` (key + int64 Feature) of each row."""
    n = values.shape[0]
    int64_list = tf.io.encode_proto(tf.fill([n, 1], values.shape[1]), [tf.constant(values, tf.int64)],
                                    ["value"], "tensorflow.Int64List")
    feature = tf.io.encode_proto(tf.ones([n, 1], tf.int32), [int64_list[:, None]], ["int64_list"],
                                 "tensorflow.Feature")
    return tf.io.encode_proto(tf.ones([n, 2], tf.int32), [tf.fill([n, 1], name), feature[:, None]],
                              ["key", "value"], "tensorflow.Features.FeatureEntry")


def encode_int64_examples(features: dict[str, np.ndarray], shared: dict[str, np.ndarray] | None = None,
                          group: int = 1) -> np.ndarray:
    """Serializes N `tf.train.Example`s whose features are all int64 lists.

    Args:
        features: name -> integer array `[N]` or `[N, k]` (k >= 1 values per
            record, the same k for every record of a feature).
        shared: name -> array `[N / group, k]` whose row r belongs to records
            `r * group .. r * group + group - 1` (for example one history
            shared by a positive and its negatives); encoded once per row.
        group: records per row of `shared`.

    Returns:
        An object array of N serialized `tf.train.Example` protos (bytes).
    """
    shared = shared or {}
    if not features and not shared:
        raise ValueError("encode_int64_examples: no features given")
    sizes = {name: _as_matrix(name, v).shape[0] for name, v in features.items()}
    sizes.update({name: _as_matrix(name, v).shape[0] * group for name, v in shared.items()})
    n = next(iter(sizes.values()))
    for name, size in sizes.items():
        if size != n:
            raise ValueError(f"encode_int64_examples: feature {name!r} has {size} records, expected {n}")
    if n == 0:
        return np.zeros((0,), object)
    entries = [_feature_entry(name, _as_matrix(name, v)) for name, v in features.items()]
    entries += [tf.repeat(_feature_entry(name, _as_matrix(name, v)), group)
                for name, v in shared.items()]
    features_msg = tf.io.encode_proto(tf.fill([n, 1], len(entries)), [tf.stack(entries, 1)],
                                      ["feature"], "tensorflow.Features")
    examples = tf.io.encode_proto(tf.ones([n, 1], tf.int32), [features_msg[:, None]], ["features"],
                                  "tensorflow.Example")
    return examples.numpy()
