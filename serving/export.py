"""Exports a trained run as a TF-Serving-ready SavedModel version.

Usage:
  python -m serving.export --run_dir=runs/dare --export_base=exports --model_name=dare

Takes the best seed of the run (highest validation AUC), maps raw ids through
the dataset's id maps in-graph, and writes EXPORT_BASE/MODEL_NAME/<version>/
atomically, plus EXPORT_BASE/models.config and batching_parameters.txt. A
retrieval run (python -m trainers.train_retrieval) is exported as its top-N
index: raw-id histories in, the --top_n raw item ids, categories and scores out.
"""

from absl import flags

import dare_tf.cli
from dare_tf.signatures import MAX_CANDIDATES

FLAGS = flags.FLAGS
flags.DEFINE_string("run_dir", None, "A training run directory (holds results.json).")
flags.DEFINE_string("export_base", None, "Base directory of the served models.")
flags.DEFINE_string("model_name", None, "Name the model is served under.")
flags.DEFINE_string("data_dir", None, "Prepared dataset of the id maps; default: the run's data_dir.")
flags.DEFINE_integer("version", None, "Version number; default: the next free one.", lower_bound=1)
flags.DEFINE_integer("max_candidates", MAX_CANDIDATES, "A ranking run: candidates per user a rank request may "
                     "carry; a row with more is answered with its error.", lower_bound=1)
flags.DEFINE_integer("top_n", 200, "A retrieval run: candidates the exported index returns.", lower_bound=1)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["run_dir", "export_base", "model_name"])


def main(argv):
    del argv  # (the configuration: the flags alone)
    from dare_tf.export import export_run

    print(export_run(FLAGS.run_dir, FLAGS.export_base, FLAGS.model_name, FLAGS.data_dir, FLAGS.version,
                     FLAGS.top_n, FLAGS.max_candidates))


def _is_retrieval(argv) -> bool:
    """Whether --run_dir is a retrieval run (its export needs tensorflow-recommenders: tf.keras as Keras 2)."""
    del argv
    from dare_tf.run_directory import RunDirectory

    try:
        return RunDirectory(FLAGS.run_dir).kind == "retrieval"
    except (OSError, ValueError):  # (no run there: main says so)
        return False


def run():
    dare_tf.cli.run(main, configure=lambda argv: argv, keras2=_is_retrieval)


if __name__ == "__main__":
    run()
