"""The retrieval stage ahead of the ranker: a two-tower candidate generator on
tensorflow-recommenders (TFRS), trained with `tfrs.tasks.Retrieval` and
evaluated with `tfrs.metrics.FactorizedTopK` against the whole catalogue.

TFRS 0.7.7 needs `tf.keras` to be Keras 2: importing this package sets
`TF_USE_LEGACY_KERAS=1` (with `tf-keras` installed) before `tf.keras` is
first resolved, and raises a clear error when it already resolved to Keras 3.
Keras 3 (`import keras`, every other dare_tf module) works in the same process.
"""

import importlib
import os
import sys

if "tensorflow" in sys.modules:
    from dare_tf.retrieval._keras2 import require_keras2

    require_keras2()  # refuses a tf.keras already resolved to Keras 3, naming the fix
else:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow loads: tf.keras will be tf-keras

# Public name -> the module that defines it (imported on first use).
_EXPORTS = {
    "evaluate_cascade": "cascade", "format_cascade": "cascade", "cascade_warnings": "verdict",
    "RetrievalConfig": "config",
    **dict.fromkeys(("KS", "CandidateTower", "QueryTower", "TwoTowerModel", "brute_force_index",
                     "load_retrieval_model"), "model"),
    **dict.fromkeys(("catalogue", "popularity_recall", "positives", "train_retrieval"), "training"),
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"dare_tf.retrieval.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'dare_tf.retrieval' has no attribute {name!r}")


__all__ = ["KS", "CandidateTower", "QueryTower", "RetrievalConfig", "TwoTowerModel", "brute_force_index",
           "load_retrieval_model", "catalogue", "cascade_warnings", "evaluate_cascade", "format_cascade",
           "popularity_recall", "positives", "train_retrieval"]
