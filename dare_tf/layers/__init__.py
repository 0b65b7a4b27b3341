"""Keras 3 building blocks of the DARE model family; each is Keras-serializable.

The search stage's variants are a family of their own: `dare_tf.search`.
What a behaviour's tables are made of (`BehaviorField`, the couplings) is
`behavior_fields`, which needs no Keras: the model's configuration reads it.

Importing this package loads nothing: each layer is imported from its module
on first use, and `import_layers()` imports (so registers with Keras) every
one, as `dare_tf.load()` does before loading a saved model.
"""

import importlib

from dare_tf._faces import lazy_face

_EXPORTS = {
    "BehaviorClustering": "dare_tf.layers.clustering",
    "BehaviorEmbedding": "dare_tf.layers.embedding",
    "DINAttention": "dare_tf.layers.din_attention",
    "PredictionHead": "dare_tf.layers.head",
    "TargetAttentionPooling": "dare_tf.layers.pooling",
    "TorchDefaultBias": "dare_tf.layers.head",
    "masked_softmax": "dare_tf.layers.pooling",
}


def import_layers() -> None:
    """Imports every layer's module: each registers its layers with Keras."""
    for module in sorted(set(_EXPORTS.values())):
        importlib.import_module(module)


__getattr__, __dir__, __all__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted([*__all__, "import_layers"])
