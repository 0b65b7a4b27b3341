"""The paper's analyses (TensorFlow backend): attention accuracy, search-stage
NDCG, gradient domination and conflict, representation discriminability,
convergence and the attention-dimension cut.

`run_analyses(data_dir, {"dare": run1, "twin": run2}, output_dir)` runs them
all on trained runs (program: `python -m trainers.analyze`); the modules hold
the computations, usable on their own. Each name is imported on first use.
"""

from dare_tf._faces import lazy_face

# Public name -> the module that defines it.
_EXPORTS = {
    "CooccurrenceCounts": "attention", "category_position_scores": "attention", "mutual_information": "attention",
    "SplitGradientRecorder": "gradients", "split_gradients": "gradients",
    "cluster_label_information": "representation", "ndcg_at_k": "retrieval", "planted_gains": "retrieval",
    "ANALYSES": "config", "AnalysisConfig": "config", "run_analyses": "suite", "write_curves": "figures",
}


__getattr__, __dir__, __all__ = lazy_face(__name__, {k: f"dare_tf.analysis.{m}" for k, m in _EXPORTS.items()})
