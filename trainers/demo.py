"""The demo behind `make demo`: prepare data, train DARE, TWIN and DIN, compare, analyse, export, serve.

1. writes a planted synthetic Taobao-format log (users of 20 to 1,000 clicks)
   and prepares it and the real Taobao sample from ../shared/data;
2. trains DARE, TWIN and DIN briefly on both (one seed) and prints a
   Table-1-shaped comparison, and DARE's test metrics by history length;
3. exports the DARE run as a TF Serving SavedModel, starts the test
   stand-in server and asks it, over gRPC, about a test user: the
   probabilities of the user's next click and of two sampled items, and
   which behaviours the model retrieved, with their weights;
4. two-stage recommendation: trains a two-tower retrieval model
   (tensorflow-recommenders), evaluates the cascade (retrieval alone and
   followed by DARE, TWIN, DIN), exports it beside DARE, serves both from
   one models.config and prints one `recommend` call for that user;
5. runs the paper's analyses on the synthetic runs (report and figures in
   WORK_DIR/analysis).

Usage: python -m trainers.demo [--work_dir=runs/demo] [--data_dir=data]
Everything is written under the current directory (or the given paths).
"""

import os

from absl import flags, logging

import dare_tf.cli

FLAGS = flags.FLAGS
flags.DEFINE_string("work_dir", os.path.join("runs", "demo"), "Where runs and exports go.")
flags.DEFINE_string("data_dir", "data", "Where the synthetic log and the prepared datasets go.")
flags.DEFINE_string("taobao_sample", os.path.join("..", "shared", "data", "taobao", "UserBehavior_sample.csv"),
                    "The real Taobao sample.")
flags.DEFINE_integer("synthetic_users", 2000, "Users of the synthetic log.", lower_bound=10)
flags.DEFINE_bool("overwrite", False, "Discard runs in --work_dir of another configuration or dataset (e.g. "
                                      "an earlier version's demo): make demo DEMO_FLAGS=--overwrite.")
flags.adopt_module_key_flags(dare_tf.cli)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from dare_tf import demo

    demo.run_demo(FLAGS.work_dir, FLAGS.data_dir, FLAGS.taobao_sample, FLAGS.synthetic_users, FLAGS.overwrite)


def run():
    dare_tf.cli.run(main, keras2=True)  # (the retrieval stage: tensorflow-recommenders)


if __name__ == "__main__":
    run()
