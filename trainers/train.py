r"""Trains one model preset on a prepared dataset; writes OUT/results.json.

Usage:
  python -m trainers.train --model=dare --data_dir=data/prepared/taobao --output_dir=runs/dare
  python -m trainers.train --flagfile=configs/dare_taobao.flags --data_dir=data/prepared/taobao \
      --output_dir=runs/dare_taobao

Vocabulary sizes come from the dataset's spec.json, and so does the history
length unless --max_len chooses another (histories are assembled from the
dataset's sequence store at any length; README, "Long histories").
With KERAS_BACKEND=jax it trains on JAX, with no TensorFlow (docs/gpu.md).
Started again with the same flags, a killed run resumes from its last
checkpoint; other flags on a finished or started run are refused (--overwrite
discards that run). The effective flags are written to OUT/flags.txt.
"""

from absl import flags

import dare_tf.cli
from dare_tf.training import program_flags
from dare_tf._files import strict_json

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "Prepared dataset (python -m data.prepare).")
flags.DEFINE_string("output_dir", None, "Run directory (checkpoints, history, results.json).")
flags.DEFINE_bool("overwrite", False, "Discard a run of another configuration in --output_dir.")
program_flags.define_train_flags()
flags.adopt_module_key_flags(dare_tf.cli)
flags.adopt_module_key_flags(program_flags)
flags.mark_flags_as_required(["data_dir", "output_dir"])


def main(config):
    from dare_tf import training

    results = training.train(FLAGS.data_dir, FLAGS.output_dir, config, overwrite=FLAGS.overwrite,
                             flags_text=dare_tf.cli.program_flags_text())
    chief = results["chief"]
    if chief:  # (the other processes of a run print nothing of it)
        from dare_tf.analysis.figures import write_curves

        write_curves(FLAGS.output_dir)
        print(training.format_results(results))
        print(strict_json({"test": results["test"], "test_std": results["test_std"]}, indent=2))


def run():
    dare_tf.cli.run(main, configure=lambda argv: program_flags.train_config_from_flags())


if __name__ == "__main__":
    run()
