"""Trains one preset on a prepared dataset; writes OUT/results.json.

Usage:
  python -m trainers.train --model=dare --data_dir=data/prepared/taobao --output_dir=runs/dare
  python -m trainers.train --flagfile=configs/dare_taobao.flags

Started again with the same command, a killed run resumes from its last checkpoint.
"""

import json

from absl import app, flags

import dare_tf
from dare_tf.training import make_strategy, train
from trainers import flags_common

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "dare", sorted(dare_tf.PRESETS), "Model preset.")
flags.DEFINE_string("data_dir", None, "Prepared dataset (python -m data.prepare).")
flags.DEFINE_string("output_dir", None, "Run directory (checkpoints, history, results.json).")
flags.mark_flags_as_required(["data_dir", "output_dir"])


def main(argv):
    del argv
    strategy = make_strategy(FLAGS.strategy, FLAGS.cpu_devices)
    results = train(FLAGS.data_dir, FLAGS.output_dir, flags_common.train_config(FLAGS.model), strategy)
    print(json.dumps({"test": results["test"], "test_std": results["test_std"]}, indent=2))


def run():
    app.run(main)


if __name__ == "__main__":
    run()
