"""HashSamplingPooling: SDIM's modelling stage, interest as hash-bucket means."""

from __future__ import annotations

import keras
from keras import ops

from dare_tf.layers.hashing import add_projection, bucket_codes, simhash_bits


@keras.saving.register_keras_serializable(package="dare_tf")
class HashSamplingPooling(keras.layers.Layer):
    """SDIM: the behaviours that share the target's hash bucket, averaged.

    `num_hashes` SimHash functions of `hash_bits` bits each (signs of a fixed
    random projection of the attention vectors' semantic part) put the target
    and every behaviour in a bucket per function. For each function, the
    representation vectors of the real behaviours in the target's bucket are
    summed and L2-normalised (SDIM's normalisation; an empty bucket gives a
    zero vector); the user interest is the mean over the functions. No
    attention weights: a behaviour counts by how many functions put it in the
    target's bucket, which is SDIM's sampling estimate of a softmax attention
    over angular similarity.

    Args:
        num_hashes: hash functions (m).
        hash_bits: bits per function (tau): 2**tau buckets each.
        position_dim: width of the position part at the end of each attention
            vector, left out of the hash.
        seed: seed of the projection.

    Call arguments:
        query: target attention embedding `[B, Da]`.
        keys: history attention embeddings `[B, L, Da]`.
        values: history representation embeddings `[B, L, Dr]`.
        mask: `[B, L]` bool, True for real behaviours.

    Returns:
        `(interest, weights, matches)`: the interest vector `[B, Dr]`, each
        behaviour's effective weight in it `[B, L]` (before normalisation:
        `sum_h match_h / m`) and the matches per function `[B, L, m]` bool.

    Example:
    >>> pool = HashSamplingPooling(num_hashes=2, hash_bits=1, seed=0)
    >>> keys = ops.ones((1, 3, 4)); values = ops.reshape(ops.arange(6, dtype="float32"), (1, 3, 2))
    >>> interest, weights, matches = pool(ops.ones((1, 4)), keys, values, ops.array([[False, True, True]]))
    >>> ops.convert_to_numpy(weights).tolist()
    [[0.0, 1.0, 1.0]]

    References:
        Cao et al., "Sampling Is All You Need on Modeling Long-Term User
        Behaviors for CTR Prediction" (SDIM), CIKM 2022.
    """

    def __init__(self, num_hashes: int = 8, hash_bits: int = 3, position_dim: int = 0, seed: int | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        if num_hashes < 1 or hash_bits < 1:
            raise ValueError(f"HashSamplingPooling: num_hashes and hash_bits must be >= 1, got "
                             f"{num_hashes} and {hash_bits}")
        self.num_hashes = num_hashes
        self.hash_bits = hash_bits
        self.position_dim = position_dim
        self.seed = seed

    def build(self, query_shape=None, *args, **kwargs):
        self.projection = add_projection(self, query_shape[-1] - self.position_dim,
                                         self.num_hashes * self.hash_bits, self.seed)
        self.built = True

    def buckets(self, vectors):
        """Bucket ids `[..., num_hashes]` of attention vectors `[..., Da]`."""
        semantic = vectors[..., : vectors.shape[-1] - self.position_dim] if self.position_dim else vectors
        return bucket_codes(simhash_bits(semantic, self.projection), self.num_hashes, self.hash_bits)

    def matches(self, query, keys, mask):
        """`[B, L, m]` bool: real behaviours in the target's bucket, per hash function."""
        return ops.logical_and(ops.equal(self.buckets(keys), ops.expand_dims(self.buckets(query), 1)),
                               ops.expand_dims(ops.cast(mask, "bool"), -1))

    def call(self, query, keys, values, mask):
        matches = self.matches(query, keys, mask)
        weights = ops.cast(matches, "float32")
        sums = ops.einsum("blh,bld->bhd", ops.cast(weights, values.dtype), values)  # [B, m, Dr]
        # The floor inside the square root keeps an empty bucket's gradient finite.
        norms = ops.sqrt(ops.maximum(ops.sum(ops.square(ops.cast(sums, "float32")), axis=-1, keepdims=True), 1e-24))
        normalised = sums / ops.cast(norms, sums.dtype)
        interest = ops.mean(normalised, axis=1)
        return interest, ops.mean(weights, axis=-1), matches

    def compute_output_spec(self, query, keys, values, mask):
        b, length = keys.shape[0], keys.shape[1]
        return (keras.KerasTensor((b, values.shape[-1]), dtype=self.compute_dtype),
                keras.KerasTensor((b, length), dtype="float32"),
                keras.KerasTensor((b, length, self.num_hashes), dtype="bool"))

    def get_config(self):
        config = super().get_config()
        config.update(num_hashes=self.num_hashes, hash_bits=self.hash_bits, position_dim=self.position_dim,
                      seed=self.seed)
        return config
