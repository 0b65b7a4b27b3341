"""Keras 3 layers of the DARE model family; each is Keras-serializable."""

from dare_tf.layers.clustering import BehaviorClustering
from dare_tf.layers.din_attention import DINAttention
from dare_tf.layers.embedding import BehaviorEmbedding
from dare_tf.layers.head import PredictionHead, TorchDefaultBias
from dare_tf.layers.pooling import TargetAttentionPooling, masked_softmax
from dare_tf.layers.sdim import HashSamplingPooling
from dare_tf.layers.search import TopKBehaviorSearch, scaled_dot_scores

__all__ = [
    "BehaviorClustering",
    "BehaviorEmbedding",
    "DINAttention",
    "HashSamplingPooling",
    "PredictionHead",
    "TargetAttentionPooling",
    "TopKBehaviorSearch",
    "TorchDefaultBias",
    "masked_softmax",
    "scaled_dot_scores",
]
