"""Keras 3 building blocks of the DARE model family; each is Keras-serializable.

The search stage's variants are a family of their own: `dare_tf.search`.
"""

from dare_tf.layers.clustering import BehaviorClustering
from dare_tf.layers.din_attention import DINAttention
from dare_tf.layers.embedding import BehaviorEmbedding
from dare_tf.layers.head import PredictionHead, TorchDefaultBias
from dare_tf.layers.pooling import TargetAttentionPooling, masked_softmax

__all__ = [
    "BehaviorClustering",
    "BehaviorEmbedding",
    "DINAttention",
    "PredictionHead",
    "TargetAttentionPooling",
    "TorchDefaultBias",
    "masked_softmax",
]
