"""Exports for TensorFlow Serving (TensorFlow only).

Layers, bottom up: `tf_serving` (raw-id tables, the `dataset` signature,
method names, warm-up requests, version directories, `models.config` and the
batching parameters), then `ranker` (a `DareModel` with its `serving_default`,
`explain`, `classify`, `regress` and `dataset` signatures) and `retrieval`
(the two-tower retrieval index). `export_run` exports a finished run of
either kind, as its run directory records it.
"""

from __future__ import annotations

from dare_tf._faces import public
from dare_tf.export.ranker import export_saved_model
from dare_tf.export.tf_serving import MODELS_CONFIG, next_version, write_server_configs
from dare_tf.run_directory import RunDirectory
from dare_tf.signatures import MAX_CANDIDATES, versions

__all__ = ["MODELS_CONFIG", "export_run", "export_saved_model", "next_version", "versions",
           "write_server_configs"]


@public("dare_tf.serving")
def export_run(run_dir: str, export_base: str, model_name: str, data_dir: str | None = None,
               version: int | None = None, top_n: int = 200, max_candidates: int = MAX_CANDIDATES) -> str:
    """Exports a finished run into `export_base/model_name/<version>/`: a ranking
    run (`trainers.train`) as its best seed (highest validation AUC), whose `rank`
    takes up to `max_candidates` candidates per user; a retrieval run
    (`trainers.train_retrieval`) as its top-`top_n` index. `data_dir` defaults
    to the dataset the run was trained on. A ranking run's warnings (results.json's:
    too few steps, a flat validation curve) travel with the export (`dataset_of`'s
    `notes`), so that what serves it can say so."""
    run = RunDirectory(run_dir)
    results = run.results()
    data_dir = data_dir or results["data_dir"]
    if run.kind == "retrieval":
        from dare_tf.export.retrieval import export_retrieval  # (imports tensorflow-recommenders)

        return export_retrieval(run_dir, data_dir, export_base, model_name, top_n)
    from dare_tf._on_tensorflow import on_tensorflow  # (a run trained on JAX: its weights are any backend's)

    return on_tensorflow(__name__, "export_ranking_run", [run_dir, export_base, model_name, data_dir, version,
                                                         max_candidates], f"exporting {run_dir} as a SavedModel")


def export_ranking_run(run_dir: str, export_base: str, model_name: str, data_dir: str, version: int | None,
                       max_candidates: int) -> str:
    """`export_run` of a ranking run, on Keras's TensorFlow backend."""
    run = RunDirectory(run_dir)
    return export_saved_model(run.load_model(), data_dir, export_base, model_name, version, max_candidates,
                              notes=run.results().get("warnings", []))

