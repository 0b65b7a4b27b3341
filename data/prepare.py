"""Prepares a raw Taobao or Tmall click log as TFRecord shards (the paper's protocol).

Usage:
  python -m data.prepare --dataset=taobao --input=UserBehavior.csv --output_dir=data/prepared/taobao
"""

from absl import app, flags

from data.protocol import Protocol, prepare

FLAGS = flags.FLAGS
flags.DEFINE_enum("dataset", None, ["taobao", "tmall"], "Format of the raw log.")
flags.DEFINE_string("input", None, "Raw log: UserBehavior.csv or user_log_format1.csv.")
flags.DEFINE_string("output_dir", None, "Directory to write (replaced atomically if it exists).")
flags.DEFINE_integer("seed", 0, "Seed of the negative sampling.")
flags.DEFINE_integer("min_clicks", 210, "Users with fewer clicks are dropped.")
flags.DEFINE_integer("max_len", 200, "History length L.")
flags.DEFINE_integer("train_targets", 19, "Train targets per user: x_{T-2-stride*j}.")
flags.DEFINE_integer("stride", 5, "Clicks between consecutive train targets.")
flags.DEFINE_integer("negatives", 2, "Negatives per positive.")
flags.DEFINE_integer("examples_per_shard", 50_000, "Examples per TFRecord shard.")
flags.DEFINE_bool("skip_bad_lines", False, "Skip and count malformed lines instead of stopping.")
flags.mark_flags_as_required(["dataset", "input", "output_dir"])


def main(argv):
    del argv
    protocol = Protocol(seed=FLAGS.seed, min_clicks=FLAGS.min_clicks, max_len=FLAGS.max_len,
                        train_targets=FLAGS.train_targets, stride=FLAGS.stride,
                        negatives=FLAGS.negatives, examples_per_shard=FLAGS.examples_per_shard)
    spec = prepare(FLAGS.dataset, FLAGS.input, FLAGS.output_dir, protocol, FLAGS.skip_bad_lines)
    print(f"{FLAGS.output_dir}: {spec.users} users, {spec.num_items - 2} items, "
          f"{spec.num_categories - 2} categories, examples {spec.counts}")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
