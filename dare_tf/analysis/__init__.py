"""The paper's analyses (TensorFlow backend): attention accuracy, search-stage
NDCG, gradient domination and conflict, representation discriminability,
convergence and the attention-dimension cut.

`run_analyses(data_dir, {"dare": run1, "twin": run2}, output_dir)` runs them
all on trained runs (program: `python -m trainers.analyze`); the modules hold
the computations, usable on their own. Each name is imported on first use.
"""

from dare_tf._faces import face_of, lazy_face

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__))
