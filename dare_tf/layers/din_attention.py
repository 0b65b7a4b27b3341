"""DINAttention: DIN's learnable activation unit."""

from __future__ import annotations

import keras
from keras import ops

from dare_tf.layers.head import TorchDefaultBias


@keras.saving.register_keras_serializable(package="dare_tf")
class DINAttention(keras.layers.Layer):
    """Scores each behaviour with an MLP on `[q, k, q - k, q * k]` (DIN).

    `score_i = MLP([q, k_i, q - k_i, q * k_i]) / D`, where the MLP is
    `Dense(units) -> PReLU (one slope) -> Dense(1)` and `D` is the embedding
    width (the paper's code, github.com/thuml/DARE).

    Args:
        units: hidden width of the activation unit (36 in DIN).
        initializer: `reference` (kernels and slope ~ N(0, 0.01), biases as
            PyTorch's defaults) or `keras` (Glorot kernels, zero biases,
            slope `prelu_init`).
        prelu_init: initial slope where `initializer` is `keras`.
        l2: L2 penalty on the kernels and the slope.
        seed: seed for the `reference` initializers.

    Call arguments:
        query: `[B, D]` target embedding.
        keys: `[B, L, D]` history embeddings.

    Returns:
        float32 scores `[B, L]`.

    Examples:
        >>> din = DINAttention(units=4)
        >>> tuple(din(ops.ones((2, 6)), ops.ones((2, 5, 6))).shape)
        (2, 5)

    References:
        Zhou et al., "Deep Interest Network for Click-Through Rate
        Prediction", KDD 2018, https://arxiv.org/abs/1706.06978
    """

    def __init__(self, units: int = 36, initializer: str = "keras", prelu_init: float = 0.1,
                 l2: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if initializer not in ("reference", "keras"):
            raise ValueError(f"DINAttention: initializer={initializer!r} is not 'reference' or 'keras'")
        self.units = units
        self.initializer = initializer
        self.prelu_init = prelu_init
        self.l2 = l2
        self.seed = seed

    def build(self, query_shape, keys_shape):
        width = keys_shape[-1]
        reg = keras.regularizers.L2(self.l2) if self.l2 else None
        ref = self.initializer == "reference"
        seed = lambda i: None if self.seed is None else self.seed + i  # noqa: E731
        normal = lambda i: keras.initializers.RandomNormal(0.0, 0.01, seed=seed(i))  # noqa: E731
        glorot = lambda i: keras.initializers.GlorotUniform(seed(i))  # noqa: E731
        self.hidden = keras.layers.Dense(
            self.units, kernel_regularizer=reg,
            kernel_initializer=normal(0) if ref else glorot(0),
            bias_initializer=TorchDefaultBias(4 * width, self.seed) if ref else "zeros",
            dtype=self.dtype_policy, name="hidden")
        self.activation = keras.layers.PReLU(
            alpha_initializer=normal(1) if ref else keras.initializers.Constant(self.prelu_init),
            alpha_regularizer=reg, shared_axes=[1, 2], dtype=self.dtype_policy, name="prelu")
        self.out = keras.layers.Dense(
            1, kernel_regularizer=reg, kernel_initializer=normal(2) if ref else glorot(2),
            bias_initializer=TorchDefaultBias(self.units, self.seed) if ref else "zeros",
            dtype=self.dtype_policy, name="output")
        self.hidden.build((None, None, 4 * width))
        self.activation.build((None, None, self.units))
        self.out.build((None, None, self.units))
        self.built = True

    def call(self, query, keys):
        queries = ops.broadcast_to(ops.expand_dims(query, 1), ops.shape(keys))
        features = ops.concatenate([queries, keys, queries - keys, queries * keys], axis=-1)
        scores = self.out(self.activation(self.hidden(features)))[..., 0]
        return ops.cast(scores, "float32") / float(keys.shape[-1])

    def compute_output_spec(self, query, keys):
        return keras.KerasTensor(keys.shape[:2], dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, initializer=self.initializer,
                      prelu_init=self.prelu_init, l2=self.l2, seed=self.seed)
        return config
