"""Locality-sensitive hashing of embeddings (SimHash), shared by ETA's search
and SDIM's sampling: the sign of a fixed random projection."""

from __future__ import annotations

import keras
from keras import ops


def add_projection(layer: keras.layers.Layer, dim: int, bits: int, seed: int | None, name: str = "projection"):
    """A fixed (non-trainable) Gaussian projection `[dim, bits]`, saved with the layer."""
    return layer.add_weight(shape=(dim, bits), initializer=keras.initializers.RandomNormal(0.0, 1.0, seed=seed),
                            trainable=False, name=name)


def simhash_bits(vectors, projection):
    """SimHash signature bits of `vectors` `[..., D]`: `projection` `[D, m]` ->
    bool `[..., m]`, True where the projection is positive. Vectors at a small
    angle share most bits (Charikar, STOC 2002)."""
    projected = ops.matmul(ops.cast(vectors, "float32"), ops.cast(projection, "float32"))
    return ops.greater(projected, 0.0)


def bucket_codes(bits, num_hashes: int, hash_bits: int):
    """Bits `[..., num_hashes * hash_bits]` -> bucket ids `[..., num_hashes]` int32
    (each hash's bits read as a binary number)."""
    shape = ops.shape(bits)[:-1]
    grouped = ops.reshape(ops.cast(bits, "int32"), (*shape, num_hashes, hash_bits))
    powers = ops.cast(2 ** ops.arange(hash_bits), "int32")
    return ops.sum(grouped * powers, axis=-1)


WORD_BITS = 16  # bits per packed word: int32 words stay non-negative, shifts stay logical


def pack_bits(bits):
    """Bool bits `[..., m]` -> int32 words `[..., ceil(m / 16)]`, 16 bits per word."""
    m = bits.shape[-1]
    words = -(-m // WORD_BITS)
    bits = ops.cast(bits, "int32")
    if words * WORD_BITS != m:
        bits = ops.pad(bits, [(0, 0)] * (len(bits.shape) - 1) + [(0, words * WORD_BITS - m)])
    return bucket_codes(bits, words, WORD_BITS)


def popcount16(words):
    """Set bits of each int32 word below 2**16 (SWAR: a few integer ops, no table)."""
    x = words - ops.bitwise_and(ops.right_shift(words, 1), 0x5555)
    x = ops.bitwise_and(x, 0x3333) + ops.bitwise_and(ops.right_shift(x, 2), 0x3333)
    x = ops.bitwise_and(x + ops.right_shift(x, 4), 0x0F0F)
    return ops.bitwise_and(x + ops.right_shift(x, 8), 0x1F)


def hamming_distance(query_words, key_words):
    """Differing bits between packed signatures: `[B, W]` vs `[B, L, W]` -> `[B, L]`
    int32; user-major, `[U, N, W]` vs `[U, L, W]` -> `[U, N, L]`."""
    if len(query_words.shape) == 3:
        return ops.sum(popcount16(ops.bitwise_xor(ops.expand_dims(key_words, 1), ops.expand_dims(query_words, 2))),
                       axis=-1)
    return ops.sum(popcount16(ops.bitwise_xor(key_words, ops.expand_dims(query_words, 1))), axis=-1)
