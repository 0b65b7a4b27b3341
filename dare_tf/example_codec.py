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


def encode_int64_examples(features: dict[str, np.ndarray]) -> np.ndarray:
    """Serializes N `tf.train.Example`s whose features are all int64 lists.

    Args:
        features: name -> integer array `[N]` or `[N, k]` (k >= 1 values per
            record, the same k for every record of a feature).

    Returns:
        An object array of N serialized `tf.train.Example` protos (bytes).
    """
    n = None
    entries = []
    for name, values in features.items():
        values = np.asarray(values)
        if values.ndim == 1:
            values = values[:, None]
        if values.ndim != 2 or values.shape[1] < 1:
            raise ValueError(f"encode_int64_examples: feature {name!r} must be [N] or [N, k>=1], "
                             f"got shape {values.shape}")
        if n is None:
            n = values.shape[0]
        elif values.shape[0] != n:
            raise ValueError(f"encode_int64_examples: feature {name!r} has {values.shape[0]} records, "
                             f"expected {n}")
        if n == 0:
            return np.zeros((0,), object)
        ones = tf.ones([n, 1], tf.int32)
        int64_list = tf.io.encode_proto(tf.fill([n, 1], values.shape[1]),
                                        [tf.constant(values, tf.int64)], ["value"],
                                        "tensorflow.Int64List")
        feature = tf.io.encode_proto(ones, [int64_list[:, None]], ["int64_list"], "tensorflow.Feature")
        entries.append(tf.io.encode_proto(
            tf.ones([n, 2], tf.int32), [tf.fill([n, 1], name), feature[:, None]], ["key", "value"],
            "tensorflow.Features.FeatureEntry"))
    if not entries:
        raise ValueError("encode_int64_examples: no features given")
    features_msg = tf.io.encode_proto(tf.fill([n, 1], len(entries)), [tf.stack(entries, 1)],
                                      ["feature"], "tensorflow.Features")
    examples = tf.io.encode_proto(tf.ones([n, 1], tf.int32), [features_msg[:, None]], ["features"],
                                  "tensorflow.Example")
    return examples.numpy()
