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

The programs (`trainers`, `serving`, `data`) parse their flags before
TensorFlow loads, so that `--help` and a bad flag answer at once: their
packages set `DARE_TF_DEFER_IMPORTS=1`, which this package consumes (it is
not passed on to child processes); `dare_tf.cli.run` then calls `load()`
once the flags are parsed. Either way, every name below is imported on
first use.

The console scripts (`dare-train`, ...) defer the same way: `import dare_tf`
runs before their program's package, so the script's name (`dare-*`) tells.

With `DARE_TF_DATA_ONLY=1` in the environment (set by the data preparation
program, `python -m data.prepare`, and so by its Beam workers), and in the
`dare-prepare` console script, `import dare_tf` imports neither Keras nor
TensorFlow: preparation needs numpy and pyarrow only, and TensorFlow's
runtime alone costs about 0.6 GB of memory.
"""

import importlib as _importlib
import os as _os
import sys as _sys

_SCRIPT = _os.path.basename((getattr(_sys, "argv", None) or [""])[0])
if _SCRIPT == "dare-prepare":
    _os.environ.setdefault("DARE_TF_DATA_ONLY", "1")
elif _SCRIPT.startswith("dare-"):  # a console script (setup.py): its program loads TensorFlow after its flags,
    _os.environ.setdefault("DARE_TF_DEFER_IMPORTS", "1")  # quietly, as `python -m` does
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Public name -> the module that defines it (imported on first use).
_EXPORTS = {
    "PRESETS": "dare_tf.config", "ModelConfig": "dare_tf.config", "make_config": "dare_tf.config",
    "INPUT_KEYS": "dare_tf.models", "DareModel": "dare_tf.models", "build_model": "dare_tf.models",
    "ClickTask": "dare_tf.tasks", "click_cross_entropy": "dare_tf.tasks",
}
_SUBMODULES = ("config", "data", "layers", "metrics", "models", "optimizers", "search", "tasks")


def load() -> None:
    """Imports Keras and the layers, searches, models and (TensorFlow backend)
    optimizers, so that saved models using them load; TensorFlow's start-up
    notices are filtered. `import dare_tf` does this unless deferred."""
    from dare_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()  # before keras imports TensorFlow: filters its harmless start-up lines
    import keras

    from dare_tf import layers, models, search  # noqa: F401

    search.import_variants()
    if keras.backend.backend() == "tensorflow":
        from dare_tf import optimizers  # noqa: F401


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(_importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return _importlib.import_module(f"dare_tf.{name}")
    raise AttributeError(f"module 'dare_tf' has no attribute {name!r}")


if _os.environ.pop("DARE_TF_DEFER_IMPORTS", None) != "1" and _os.environ.get("DARE_TF_DATA_ONLY") != "1":
    load()

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
