"""Trains a grid (models x embedding dims x seeds) and writes a Table-1-shaped comparison.

Usage:
  python -m trainers.reproduce --data_dirs=data/prepared/taobao,data/prepared/tmall \
      --models=dare,twin,din --dims=16,64 --seeds=0,1,2,3,4 --output_dir=runs/table1

Writes OUT/table1.md and OUT/table1.csv with test AUC as mean (std) per model
and (dataset, dim); each cell's run lives in OUT/<dataset>/d<dim>/<model>/ and
is resumed or reused when the command runs again.
"""

import csv
import os

from absl import app, flags

from dare_tf.spec import DatasetSpec
from dare_tf.training import make_strategy, train
from trainers import flags_common

FLAGS = flags.FLAGS
flags.DEFINE_list("data_dirs", None, "Prepared datasets (columns of the table).")
flags.DEFINE_list("models", ["dare", "twin", "twin_hard", "twin_proj", "twin_no_tr", "twin_4e", "din"],
                  "Presets (rows of the table).")
flags.DEFINE_list("dims", ["16"], "Embedding dims.")
flags.DEFINE_string("metric", "auc", "Test metric in the table: auc, gauc, category_auc or logloss.")
flags.DEFINE_string("output_dir", None, "Where runs and tables go.")
flags.mark_flags_as_required(["data_dirs", "output_dir"])


def reproduce(data_dirs, models, dims, output_dir, config_for, strategy, metric="auc"):
    """Runs the grid; returns rows {model, column -> (mean, std)}."""
    columns, cells = [], {}
    for data_dir in data_dirs:
        dataset = DatasetSpec.load(data_dir).dataset
        for dim in dims:
            column = f"{dataset} d={dim}"
            columns.append(column)
            for model in models:
                out = os.path.join(output_dir, os.path.basename(os.path.normpath(data_dir)), f"d{dim}", model)
                results = train(data_dir, out, config_for(model, dim), strategy)
                cells[(model, column)] = (results["test"][metric], results["test_std"][metric])
    write_tables(output_dir, models, columns, cells, metric)
    return columns, cells


def write_tables(output_dir, models, columns, cells, metric):
    os.makedirs(output_dir, exist_ok=True)
    lines = [f"| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for model in models:
        lines.append(f"| {model} | " + " | ".join(
            f"{cells[(model, c)][0]:.5f} ({cells[(model, c)][1]:.5f})" for c in columns) + " |")
    table = "\n".join(lines)
    with open(os.path.join(output_dir, "table1.md"), "w") as f:
        f.write(f"Test {metric}, mean (std) over seeds\n\n{table}\n")
    with open(os.path.join(output_dir, "table1.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model"] + [f"{c} mean" for c in columns] + [f"{c} std" for c in columns])
        for model in models:
            w.writerow([model] + [cells[(model, c)][0] for c in columns] + [cells[(model, c)][1] for c in columns])
    print(table)


def main(argv):
    del argv
    strategy = make_strategy(FLAGS.strategy, FLAGS.cpu_devices)

    def config_for(model, dim):
        config = flags_common.train_config(model)
        overrides = dict(config.model_overrides, embedding_dim=int(dim))
        return flags_common.TrainConfig(**{**config.__dict__, "model_overrides": overrides})

    reproduce(FLAGS.data_dirs, FLAGS.models, [int(d) for d in FLAGS.dims], FLAGS.output_dir, config_for,
              strategy, FLAGS.metric)


def run():
    app.run(main)


if __name__ == "__main__":
    run()
