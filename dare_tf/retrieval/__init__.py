"""The retrieval stage ahead of the ranker: a two-tower candidate generator on
tensorflow-recommenders (TFRS), trained with `tfrs.tasks.Retrieval` and
evaluated with `tfrs.metrics.FactorizedTopK` against the whole catalogue.

TFRS 0.7.7 needs `tf.keras` to be Keras 2: importing this package sets
`TF_USE_LEGACY_KERAS=1` (with `tf-keras` installed) before `tf.keras` is
first resolved, and raises a clear error when it already resolved to Keras 3.
Keras 3 (`import keras`, every other dare_tf module) works in the same process.
"""

from dare_tf.retrieval.cascade import evaluate_cascade, format_cascade
from dare_tf.retrieval.model import (KS, CandidateTower, QueryTower, TwoTowerModel, brute_force_index,
                                     load_retrieval_model)
from dare_tf.retrieval.training import RetrievalConfig, catalogue, popularity_recall, positives, train_retrieval

__all__ = ["KS", "CandidateTower", "QueryTower", "RetrievalConfig", "TwoTowerModel", "brute_force_index", "load_retrieval_model",
           "catalogue", "evaluate_cascade", "format_cascade", "popularity_recall", "positives",
           "train_retrieval"]
