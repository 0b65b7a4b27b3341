"""HashSamplingSearch: SDIM, the behaviours in the target's hash buckets, averaged."""

from __future__ import annotations

from keras import ops

from dare_tf.layers.hashing import add_projection, bucket_codes, simhash_bits
from dare_tf.search.base import PADDING_SCORE, BehaviorSearch, every_slot
from dare_tf.search.registry import offset_seed, register_search


def _mean_of_normalized(sums):
    """`[B, m, Dr]` per-hash bucket sums -> `[B, Dr]`: each L2-normalised, then averaged."""
    # The floor inside the square root keeps an empty bucket's gradient finite.
    norms = ops.sqrt(ops.maximum(ops.sum(ops.square(ops.cast(sums, "float32")), axis=-1, keepdims=True), 1e-24))
    return ops.mean(sums / ops.cast(norms, sums.dtype), axis=1)


@register_search("sdim")
class HashSamplingSearch(BehaviorSearch):
    """SDIM: the behaviours that share the target's hash bucket, averaged; no top K.

    `num_hashes` SimHash functions of `hash_bits` bits each (signs of a fixed
    random projection of the attention vectors' semantic part) put the target
    and every behaviour in a bucket per function. For each function, the
    representation vectors of the real behaviours in the target's bucket are
    summed and L2-normalised (SDIM's normalisation; an empty bucket gives a
    zero vector); the user interest is the mean over the functions. No
    attention weights: a behaviour counts by how many functions put it in the
    target's bucket, which is SDIM's sampling estimate of a softmax attention
    over angular similarity. The stage pools itself: its result holds
    `pooled` `[B, Dr]` and `weights` `[B, L]` (`sum_h match_h / m`), and
    `explain` holds `hash_matches` `[B, L, m]` bool.

    Args:
        num_hashes: hash functions (m).
        hash_bits: bits per function (tau): 2**tau buckets each.
        seed: seed of the projection.

    Examples:
        >>> search = HashSamplingSearch(num_hashes=2, hash_bits=1, seed=0)
        >>> keys = ops.ones((1, 3, 4)); values = ops.reshape(ops.arange(6, dtype="float32"), (1, 3, 2))
        >>> out = search(ops.ones((1, 4)), keys, values, ops.array([[False, True, True]]))
        >>> ops.convert_to_numpy(out["weights"]).tolist()
        [[0.0, 1.0, 1.0]]

    References:
        Cao et al., "Sampling Is All You Need on Modeling Long-Term User
        Behaviors for CTR Prediction" (SDIM), CIKM 2022.
    """

    selects_slots = False
    keeps_top_k = False
    explain_outputs = ("hash_matches",)

    def __init__(self, num_hashes: int = 8, hash_bits: int = 3, position_dim: int = 0, seed: int | None = None,
                 top_k: int = 1, **kwargs):
        super().__init__(top_k, position_dim, **kwargs)
        if num_hashes < 1 or hash_bits < 1:
            raise ValueError(f"HashSamplingSearch: num_hashes and hash_bits must be >= 1, got "
                             f"{num_hashes} and {hash_bits}")
        self.num_hashes = num_hashes
        self.hash_bits = hash_bits
        self.seed = seed

    @classmethod
    def from_model_config(cls, config, seed=None):
        return cls(config.num_hashes, config.hash_bits, position_dim=config.attention_pos_dim,
                   seed=offset_seed(seed, 400), name="search")

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

    def call(self, query, keys, values, mask, target_category=None, history_categories=None):
        matches = self.matches(query, keys, mask)
        weights = ops.cast(matches, "float32")
        interest = _mean_of_normalized(ops.einsum("blh,bld->bhd", ops.cast(weights, values.dtype), values))
        return {"positions": every_slot(mask), "pooled": interest, "weights": ops.mean(weights, axis=-1),
                "explain": {"hash_matches": matches}}

    def search_users(self, query, keys, values, mask, target_category=None, history_categories=None):
        """User-major: each behaviour hashed once per user, the N targets' buckets
        matched against them, `[U, N, L, m]`, and summed per target."""
        self.built_for(query)
        buckets = self.buckets(keys)  # [U, L, m]
        matches = ops.logical_and(ops.equal(ops.expand_dims(buckets, 1), ops.expand_dims(self.buckets(query), 2)),
                                  ops.expand_dims(ops.expand_dims(ops.cast(mask, "bool"), 1), -1))  # [U, N, L, m]
        weights = ops.cast(matches, "float32")
        sums = ops.einsum("unlh,uld->unhd", ops.cast(weights, values.dtype), values)  # [U, N, m, Dr]
        interest = _mean_of_normalized(ops.reshape(sums, (-1, self.num_hashes, values.shape[-1])))
        length = keys.shape[1]
        flat_matches = ops.reshape(matches, (-1, length, self.num_hashes))
        return {"positions": every_slot(flat_matches[..., 0]), "pooled": interest,
                "weights": ops.mean(ops.cast(flat_matches, "float32"), axis=-1),
                "explain": {"hash_matches": flat_matches}}

    def slot_scores(self, query, keys, mask, target_category=None, history_categories=None):
        weights = ops.mean(ops.cast(self.matches(query, keys, mask), "float32"), axis=-1)
        return ops.where(ops.cast(mask, "bool"), weights, PADDING_SCORE)

    def search_only(self, query, keys, mask, target_category=None, history_categories=None):
        return self.matches(query, keys, mask)

    def get_config(self):
        config = super().get_config()
        config.update(num_hashes=self.num_hashes, hash_bits=self.hash_bits, seed=self.seed)
        return config
