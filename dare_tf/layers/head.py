"""PredictionHead: BatchNorm -> MLP with PReLU -> two-class softmax."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="dare_tf")
class TorchDefaultBias(keras.initializers.Initializer):
    """PyTorch's default bias init for a linear layer: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

    The paper's code keeps PyTorch's default biases (github.com/thuml/DARE), so
    reference mode draws them from the same distribution.
    """

    def __init__(self, fan_in: int, seed=None):
        self.fan_in = fan_in
        self.seed = seed

    def __call__(self, shape, dtype=None):
        bound = 1.0 / float(self.fan_in) ** 0.5
        return keras.random.uniform(shape, -bound, bound, dtype=dtype, seed=self.seed)

    def get_config(self):
        return {"fan_in": self.fan_in, "seed": self.seed}


@keras.saving.register_keras_serializable(package="dare_tf")
class PredictionHead(keras.layers.Layer):
    """Click probability from features: BatchNorm, hidden Dense+PReLU layers, 2-way softmax.

    Mirrors the paper's code's heads (github.com/thuml/DARE): main MLP
    `BatchNorm -> 200 -> PReLU -> 80 -> PReLU -> 2 -> softmax`, auxiliary
    `BatchNorm -> 200 -> PReLU -> 2`. BatchNorm uses PyTorch's momentum 0.1
    and epsilon 1e-5; each PReLU has one slope.

    Args:
        units: hidden widths.
        initializer: `reference` (every non-bias weight, BatchNorm gamma and
            PReLU slope ~ N(0, 0.01); biases as PyTorch's defaults) or `keras`.
        prelu_init: initial slope where `initializer` is `keras`.
        l2: L2 penalty on kernels, BatchNorm gammas and PReLU slopes.
        seed: seed for the `reference` initializers.
        synchronized: BatchNorm statistics over all replicas' batches.

    Call arguments:
        features: `[B, F]`.
        training: BatchNorm mode.

    Returns:
        float32 click probability `[B]` (softmax of the two logits, class 1).

    Examples:
        >>> head = PredictionHead(units=(8,))
        >>> tuple(head(ops.ones((3, 5))).shape)
        (3,)
    """

    def __init__(self, units=(200, 80), initializer: str = "keras", prelu_init: float = 0.1,
                 l2: float = 0.0, seed: int | None = None, synchronized: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.synchronized = synchronized
        if initializer not in ("reference", "keras"):
            raise ValueError(f"PredictionHead: initializer={initializer!r} is not 'reference' or 'keras'")
        self.units = tuple(units)
        self.initializer = initializer
        self.prelu_init = prelu_init
        self.l2 = l2
        self.seed = seed

    def _normal(self, offset):
        seed = None if self.seed is None else self.seed + offset
        return keras.initializers.RandomNormal(0.0, 0.01, seed=seed)

    def _glorot(self, offset):
        return keras.initializers.GlorotUniform(None if self.seed is None else self.seed + offset)

    def build(self, input_shape):
        reg = keras.regularizers.L2(self.l2) if self.l2 else None
        ref = self.initializer == "reference"
        self.norm = keras.layers.BatchNormalization(
            momentum=0.9, epsilon=1e-5, gamma_regularizer=reg, synchronized=self.synchronized,
            gamma_initializer=self._normal(0) if ref else "ones", name="batch_norm")
        self.norm.build(input_shape)
        self.dense_layers, self.activations = [], []
        fan_in = input_shape[-1]
        for i, width in enumerate(self.units + (2,)):
            dense = keras.layers.Dense(
                width, kernel_regularizer=reg,
                kernel_initializer=self._normal(2 * i + 1) if ref else self._glorot(2 * i + 1),
                bias_initializer=TorchDefaultBias(fan_in, self.seed) if ref else "zeros",
                name=f"dense_{i}",
                # Logits and softmax stay float32 under mixed precision.
                dtype="float32" if i == len(self.units) else self.dtype_policy)
            dense.build((None, fan_in))
            self.dense_layers.append(dense)
            if i < len(self.units):
                prelu = keras.layers.PReLU(
                    alpha_initializer=self._normal(2 * i + 2) if ref else keras.initializers.Constant(self.prelu_init),
                    alpha_regularizer=reg, shared_axes=[1], name=f"prelu_{i}")
                prelu.build((None, width))
                self.activations.append(prelu)
            fan_in = width
        self.built = True

    def call(self, features, training=False):
        x = self.norm(features, training=training)
        for dense, act in zip(self.dense_layers[:-1], self.activations):
            x = act(dense(x))
        logits = self.dense_layers[-1](ops.cast(x, "float32"))
        return ops.softmax(logits, axis=-1)[:, 1]

    def compute_output_spec(self, features, training=False):
        return keras.KerasTensor((features.shape[0],), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(units=list(self.units), initializer=self.initializer,
                      prelu_init=self.prelu_init, l2=self.l2, seed=self.seed,
                      synchronized=self.synchronized)
        return config
