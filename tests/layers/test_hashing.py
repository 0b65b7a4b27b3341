"""Packed SimHash signatures."""

import keras
import numpy as np



def test_packed_signatures_count_differing_bits(rng):
    from dare_tf.layers.hashing import hamming_distance, pack_bits

    a = rng.random((3, 37)) < 0.5
    b = rng.random((3, 5, 37)) < 0.5
    got = keras.ops.convert_to_numpy(hamming_distance(pack_bits(a), pack_bits(b)))
    np.testing.assert_array_equal(got, (a[:, None, :] != b).sum(-1))
