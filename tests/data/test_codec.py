import numpy as np
import pytest
import tensorflow as tf

from dare_tf.data.codec import encode_int64_examples


def test_round_trips_through_protobuf_and_tf_parser(rng):
    n = 50
    # Values spanning 1..9-byte varints, scalars and lists, including zeros.
    wide = (rng.integers(0, 2**62, (n, 7)) >> rng.integers(0, 62, (n, 7))).astype(np.int64)
    features = {
        "uid": rng.integers(0, 10**6, n),
        "label": rng.integers(0, 2, n),
        "hist_items": np.where(rng.random((n, 300)) < 0.3, 0, rng.integers(1, 5 * 10**6, (n, 300))),
        "wide": wide,
    }
    encoded = encode_int64_examples(features)
    assert len(encoded) == n
    for i in (0, 17, n - 1):
        parsed = tf.train.Example.FromString(encoded[i]).features.feature
        assert set(parsed) == set(features)
        for name, values in features.items():
            assert list(parsed[name].int64_list.value) == np.atleast_1d(values[i]).tolist()
    spec = {"uid": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
            "hist_items": tf.io.FixedLenFeature([300], tf.int64), "wide": tf.io.FixedLenFeature([7], tf.int64)}
    parsed = tf.io.parse_example(list(encoded), spec)
    for k, v in parsed.items():
        np.testing.assert_array_equal(v.numpy().reshape(n, -1), np.asarray(features[k]).reshape(n, -1))


def test_errors():
    with pytest.raises(ValueError, match="feature 'b' has 2 records, expected 3"):
        encode_int64_examples({"a": np.zeros(3, int), "b": np.zeros(2, int)})
    with pytest.raises(ValueError, match="must be \\[N\\] or \\[N, k>=1\\]"):
        encode_int64_examples({"a": np.zeros((3, 0), int)})
    assert len(encode_int64_examples({"a": np.zeros((0, 2), int)})) == 0


def test_shared_rows_are_repeated_per_group(rng):
    hist = rng.integers(0, 10**6, (4, 9))
    label = np.tile([1, 0, 0], 4)
    records = encode_int64_examples({"label": label}, shared={"hist": hist}, group=3)
    parsed = tf.io.parse_example(list(records), {"label": tf.io.FixedLenFeature([], tf.int64),
                                                 "hist": tf.io.FixedLenFeature([9], tf.int64)})
    np.testing.assert_array_equal(parsed["hist"].numpy(), np.repeat(hist, 3, axis=0))
    np.testing.assert_array_equal(parsed["label"].numpy(), label)
    with pytest.raises(ValueError, match="feature 'hist' has 12 records, expected 11"):
        encode_int64_examples({"label": label[:11]}, shared={"hist": hist}, group=3)
