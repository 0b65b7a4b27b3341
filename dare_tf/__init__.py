"""dare-tf: DARE and its baselines for long-sequence recommendation, in Keras 3.

Public API: what is imported here. Everything else is private.
"""

from dare_tf import layers
from dare_tf.config import PRESETS, ModelConfig, make_config
from dare_tf.models import INPUT_KEYS, DareModel, build_model, click_cross_entropy

__version__ = "0.1.0"

__all__ = [
    "INPUT_KEYS",
    "PRESETS",
    "DareModel",
    "ModelConfig",
    "build_model",
    "click_cross_entropy",
    "layers",
    "make_config",
]
