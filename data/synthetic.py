"""Writes a Taobao-format click log with planted structure, plus its ground truth.

Usage:
  python -m data.synthetic --output=data/synthetic/log.csv --users=2000 --seed=0
"""

import os

os.environ.setdefault("DARE_TF_DATA_ONLY", "1")  # numpy only: no TensorFlow runtime

from absl import flags  # noqa: E402

import dare_tf.cli  # noqa: E402
from dare_tf.data.synthetic import SyntheticConfig, write  # noqa: E402

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
    dare_tf.cli.run(main)


if __name__ == "__main__":
    run()
