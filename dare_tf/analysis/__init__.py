"""The paper's analyses (TensorFlow backend): attention accuracy, search-stage
NDCG, gradient domination and conflict, representation discriminability,
convergence and the attention-dimension cut.

`run_analyses(data_dir, {"dare": run1, "twin": run2}, output_dir)` runs them
all on trained runs (program: `python -m trainers.analyze`); the modules hold
the computations, usable on their own.
"""

from dare_tf.analysis.attention import CooccurrenceCounts, category_position_scores, mutual_information
from dare_tf.analysis.gradients import SplitGradientRecorder, split_gradients
from dare_tf.analysis.representation import cluster_label_information
from dare_tf.analysis.retrieval import ndcg_at_k, planted_gains
from dare_tf.analysis.suite import ANALYSES, AnalysisConfig, run_analyses

__all__ = ["ANALYSES", "AnalysisConfig", "CooccurrenceCounts", "SplitGradientRecorder", "category_position_scores",
           "cluster_label_information", "mutual_information", "ndcg_at_k", "planted_gains", "run_analyses",
           "split_gradients"]
