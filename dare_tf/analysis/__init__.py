"""The paper's analyses (TensorFlow backend): attention accuracy, search-stage
NDCG, gradient domination and conflict, representation discriminability,
convergence and the attention-dimension cut.

`run_analyses(data_dir, {"dare": run1, "twin": run2}, output_dir)` runs them
all on trained runs (program: `python -m trainers.analyze`); the modules hold
the computations, usable on their own. Each name is imported on first use.
"""

import importlib

# Public name -> the module that defines it.
_EXPORTS = {
    "CooccurrenceCounts": "attention", "category_position_scores": "attention", "mutual_information": "attention",
    "SplitGradientRecorder": "gradients", "split_gradients": "gradients",
    "cluster_label_information": "representation", "ndcg_at_k": "retrieval", "planted_gains": "retrieval",
    "ANALYSES": "config", "AnalysisConfig": "config", "run_analyses": "suite",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"dare_tf.analysis.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'dare_tf.analysis' has no attribute {name!r}")


__all__ = ["ANALYSES", "AnalysisConfig", "CooccurrenceCounts", "SplitGradientRecorder", "category_position_scores",
           "cluster_label_information", "mutual_information", "ndcg_at_k", "planted_gains", "run_analyses",
           "split_gradients"]
