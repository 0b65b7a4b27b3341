r"""Trains a grid (models x embedding dims x seeds) and writes a Table-1-shaped comparison.

Usage:
  python -m trainers.reproduce --data_dirs=data/prepared/taobao,data/prepared/tmall \
      --models=dare,twin,din --dims=16,64 --seeds=0,1,2,3,4 --output_dir=runs/table1

Writes OUT/table1.md and OUT/table1.csv with test AUC as mean (std) per model
and (dataset, dim); each cell's run lives in OUT/<dataset>/d<dim>/<model>/ and
is resumed or reused when the command runs again.
"""

import dataclasses

from absl import app, flags

import dare_tf.cli
from dare_tf.training import program_flags
from dare_tf.model.presets import ABLATIONS, PRESETS

FLAGS = flags.FLAGS
flags.DEFINE_list("data_dirs", None, "Prepared datasets (columns of the table).")
flags.DEFINE_list("models", [p for p in PRESETS if p not in ABLATIONS],
                  "Presets (rows of the table); by default every preset but the ablations "
                  "(dare_tf.model.presets.ABLATIONS).")
flags.DEFINE_list("dims", ["16"], "Embedding dims.")
flags.DEFINE_enum("metric", "auc", ["auc", "gauc", "category_auc", "logloss"], "Test metric in the table.")
flags.DEFINE_string("output_dir", None, "Where runs and tables go.")
flags.DEFINE_bool("overwrite", False, "Discard a cell's run of another configuration or dataset.")
program_flags.define_train_flags(with_model=False)
flags.adopt_module_key_flags(dare_tf.cli)
flags.adopt_module_key_flags(program_flags)
flags.mark_flags_as_required(["data_dirs", "output_dir"])


def configure(argv):
    """The grid's base configuration and dims (refused before TensorFlow loads)."""
    del argv
    from dare_tf.model.presets import PRESETS

    unknown = sorted(set(FLAGS.models) - set(PRESETS))
    if unknown:
        raise app.UsageError(f"--models: unknown preset(s) {unknown}; known: {sorted(PRESETS)}")
    try:
        dims = [int(d) for d in FLAGS.dims]
    except ValueError:
        raise app.UsageError(f"--dims={','.join(FLAGS.dims)}: expected comma-separated integers") from None
    return program_flags.train_config_from_flags(preset=FLAGS.models[0]), dims


def main(configuration):
    from dare_tf.experiments import reproduce

    base, dims = configuration

    def config_for(model, dim, data_dir):
        return dataclasses.replace(base, preset=model,
                                   model_overrides=dict(base.model_overrides, embedding_dim=dim))

    reproduce(FLAGS.data_dirs, FLAGS.models, dims, FLAGS.output_dir, config_for, FLAGS.metric,
              FLAGS.overwrite)


def run():
    dare_tf.cli.run(main, configure=configure)


if __name__ == "__main__":
    run()
