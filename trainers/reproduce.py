"""Trains a grid (models x embedding dims x seeds) and writes a Table-1-shaped comparison.

Usage:
  python -m trainers.reproduce --data_dirs=data/prepared/taobao,data/prepared/tmall \
      --models=dare,twin,din --dims=16,64 --seeds=0,1,2,3,4 --output_dir=runs/table1

Writes OUT/table1.md and OUT/table1.csv with test AUC as mean (std) per model
and (dataset, dim); each cell's run lives in OUT/<dataset>/d<dim>/<model>/ and
is resumed or reused when the command runs again.
"""

import dataclasses

from absl import app, flags

from dare_tf.experiments import reproduce
from dare_tf.training import make_strategy
from trainers import flags_common

FLAGS = flags.FLAGS
flags.DEFINE_list("data_dirs", None, "Prepared datasets (columns of the table).")
flags.DEFINE_list("models", ["dare", "twin", "twin_hard", "twin_proj", "twin_no_tr", "twin_4e", "din"],
                  "Presets (rows of the table).")
flags.DEFINE_list("dims", ["16"], "Embedding dims.")
flags.DEFINE_string("metric", "auc", "Test metric in the table: auc, gauc, category_auc or logloss.")
flags.DEFINE_string("output_dir", None, "Where runs and tables go.")
flags.mark_flags_as_required(["data_dirs", "output_dir"])


def main(argv):
    del argv
    strategy = make_strategy(FLAGS.strategy, FLAGS.cpu_devices)

    def config_for(model, dim):
        config = flags_common.train_config(model)
        return dataclasses.replace(config, model_overrides=dict(config.model_overrides, embedding_dim=int(dim)))

    reproduce(FLAGS.data_dirs, FLAGS.models, [int(d) for d in FLAGS.dims], FLAGS.output_dir, config_for,
              strategy, FLAGS.metric)


def run():
    app.run(main)


if __name__ == "__main__":
    run()
