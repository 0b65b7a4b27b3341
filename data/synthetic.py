"""Writes a Taobao-format click log with planted structure, plus its ground truth.

Usage:
  python -m data.synthetic --output=data/synthetic/log.csv --users=2000 --seed=0
"""

from absl import flags

import dare_tf.cli
from dare_tf.data.synthetic import SyntheticConfig, write

FLAGS = flags.FLAGS
flags.DEFINE_string("output", None, "Path of the Taobao-format CSV to write.")
dare_tf.cli.define_flags(SyntheticConfig)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["output"])


def main(argv):
    del argv
    truth = write(dare_tf.cli.from_flags(SyntheticConfig), FLAGS.output)
    print(f"{FLAGS.output}: {truth['rows']} rows; generator's own test AUC {truth['generator_auc']:.4f}")


def run():
    dare_tf.cli.run(main, tensorflow=False)  # numpy only: no TensorFlow runtime


if __name__ == "__main__":
    run()
