"""The retrieval stage ahead of the ranker: a two-tower candidate generator on
tensorflow-recommenders (TFRS), trained with `tfrs.tasks.Retrieval` and
evaluated with `tfrs.metrics.FactorizedTopK` against the whole catalogue.

TFRS 0.7.7 needs `tf.keras` to be Keras 2 (tf-keras): call `use_keras2()`
before TensorFlow is first imported (the programs do), or set
`TF_USE_LEGACY_KERAS=1` in the environment. Importing this package changes
nothing; its modules that need TFRS refuse, naming the fix, a `tf.keras` that
is not Keras 2. Keras 3 (`import keras`, every other dare_tf module) works in
the same process.
"""

from dare_tf._faces import lazy_face

# Public name -> the module that defines it (imported on first use).
_EXPORTS = {
    "use_keras2": "_keras2", "evaluate_cascade": "cascade", "format_cascade": "cascade", "cascade_warnings": "verdict",
    "RetrievalConfig": "config",
    **dict.fromkeys(("KS", "CandidateTower", "QueryTower", "TwoTowerModel", "brute_force_index",
                     "load_retrieval_model"), "model"),
    **dict.fromkeys(("catalogue", "popularity_recall", "positives", "train_retrieval"), "training"),
}


__getattr__, __dir__, __all__ = lazy_face(__name__, {k: f"dare_tf.retrieval.{m}" for k, m in _EXPORTS.items()})
