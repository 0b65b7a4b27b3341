"""dare-tf: DARE and its baselines for long-sequence recommendation, in Keras 3.

Public API (everything else is private, by a leading underscore or by not
being listed here):

- `dare_tf.layers`: the Keras layers (any backend).
- `dare_tf.search`: the search stage's variants, one `BehaviorSearch`
  subclass each, and their registry (any backend).
- `dare_tf.DareModel`, `dare_tf.build_model`, `dare_tf.ModelConfig`,
  `dare_tf.PRESETS`, `dare_tf.make_config` (also as `dare_tf.models`,
  `dare_tf.config`): the models (any backend).
- `dare_tf.metrics`: exact AUC, GAUC, category AUC, logloss (numpy).
- `dare_tf.data`: schema and dataset spec (pure Python); preparation,
  synthetic logs and the tf.data pipeline (TensorFlow).
- `dare_tf.optimizers`: `FusedAdam`, `LazyAdam` (TensorFlow).
- `dare_tf.training`: `train`, `TrainConfig` and the callbacks (TensorFlow).
- `dare_tf.serving`: export, client, the stand-in test server (TensorFlow).

With the TensorFlow backend (the default) `import dare_tf` also registers the
layers and optimizers, so that saved models that use them load.

With `DARE_TF_DATA_ONLY=1` in the environment (set by the data preparation
program, `python -m data.prepare`, and so by its Beam workers), and in the
`dare-prepare` console script, `import dare_tf` imports neither Keras nor
TensorFlow: preparation needs numpy and pyarrow only, and TensorFlow's
runtime alone costs about 0.6 GB of memory.
"""

import os as _os
import sys as _sys

if _os.path.basename((getattr(_sys, "argv", None) or [""])[0]) == "dare-prepare":
    _os.environ.setdefault("DARE_TF_DATA_ONLY", "1")

if _os.environ.get("DARE_TF_DATA_ONLY") != "1":
    from dare_tf._startup import import_tensorflow_quietly as _quiet

    _quiet()  # before keras imports TensorFlow: filters its harmless start-up lines

    import keras as _keras

    from dare_tf import config, data, layers, metrics, models, search
    from dare_tf.config import PRESETS, ModelConfig, make_config
    from dare_tf.models import INPUT_KEYS, DareModel, build_model
    from dare_tf.tasks import ClickTask, click_cross_entropy

    if _keras.backend.backend() == "tensorflow":
        from dare_tf import optimizers  # noqa: F401

__version__ = "0.3.0"

__all__ = [
    "INPUT_KEYS",
    "PRESETS",
    "ClickTask",
    "DareModel",
    "ModelConfig",
    "build_model",
    "click_cross_entropy",
    "config",
    "data",
    "layers",
    "make_config",
    "metrics",
    "models",
    "search",
]
