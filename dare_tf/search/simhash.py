"""SimHashTopKSearch: ETA's search, the top K by SimHash Hamming distance."""

from __future__ import annotations

from keras import ops

from dare_tf.layers.hashing import add_projection, hamming_distance, pack_bits, simhash_bits
from dare_tf.search.base import TopKSearch, slot_axis
from dare_tf.search.registry import offset_seed, register_search


def hamming_priority(query_signature, key_signatures, mask, bits: int):
    """SimHash search's ranking `[B, L]` int32 from packed signatures (`pack_bits`):
    fewer differing bits first, then the more recent slot; padding below every
    real slot. User-major (`query_signature` `[U, N, W]`): `[U, N, L]`."""
    length = ops.shape(key_signatures)[1]
    differing = hamming_distance(query_signature, key_signatures)
    priority = (bits - differing) * length + ops.arange(length, dtype="int32")
    return ops.where(slot_axis(mask, query_signature), priority, -1)


@register_search("simhash")
class SimHashTopKSearch(TopKSearch):
    """Keeps the K slots whose SimHash signature is nearest the target's.

    A signature is `num_bits` signs of a fixed random projection of the
    attention vector's semantic part (without the position part); slots are
    ranked by Hamming distance, ties by recency. A history's signatures do not
    depend on the target, so they can be computed once (`signatures`) and
    passed in (`history_signatures`). Only the K kept slots are scored.

    Args:
        num_bits: signature bits.
        seed: seed of the projection.

    Examples:
        >>> search = SimHashTopKSearch(top_k=2, num_bits=8, seed=0)
        >>> out = search(ops.ones((1, 4)), ops.ones((1, 3, 4)), None, ops.array([[True, True, False]]))
        >>> ops.convert_to_numpy(out["valid"]).tolist()
        [[True, True]]

    References:
        Chen et al., "End-to-End User Behavior Retrieval in Click-Through Rate
        Prediction Model" (ETA), arXiv 2108.04468, 2021.
    """

    def __init__(self, top_k: int = 20, position_dim: int = 0, num_bits: int = 32, seed: int | None = None,
                 **kwargs):
        super().__init__(top_k, position_dim, **kwargs)
        if num_bits < 1:
            raise ValueError(f"SimHashTopKSearch: num_bits must be >= 1, got {num_bits}")
        self.num_bits = num_bits
        self.seed = seed
        self.projection = None

    @classmethod
    def from_model_config(cls, config, seed=None):
        return cls(config.top_k, config.attention_pos_dim, num_bits=config.hash_bits, seed=offset_seed(seed, 400),
                   name="search")

    def build(self, query_shape=None, *args, **kwargs):
        if self.projection is None:
            self.projection = add_projection(self, query_shape[-1] - self.position_dim, self.num_bits, self.seed)
        self.built = True

    def signatures(self, vectors):
        """SimHash signatures of attention vectors `[..., D]`: `num_bits` bits
        packed 16 per int32 word, `[..., ceil(num_bits / 16)]`."""
        semantic = vectors[..., : vectors.shape[-1] - self.position_dim] if self.position_dim else vectors
        return pack_bits(simhash_bits(semantic, self.projection))

    def ranking(self, query, keys, mask, target_category=None, history_categories=None, history_signatures=None):
        keys_signatures = self.signatures(keys) if history_signatures is None else history_signatures
        return hamming_priority(self.signatures(query), keys_signatures, mask, self.num_bits), None

    def get_config(self):
        config = super().get_config()
        config.update(num_bits=self.num_bits, seed=self.seed)
        return config
