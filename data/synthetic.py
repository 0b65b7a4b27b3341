"""Writes a Taobao-format click log with planted structure, plus its ground truth.

Usage:
  python -m data.synthetic --output=data/synthetic/log.csv --users=2000 --seed=0
  # a log like the paper's at its real size (or --fraction of it), in the real file's format:
  python -m data.synthetic --like=taobao --output=data/synthetic/taobao_like.csv [--fraction=0.1]
  python -m data.synthetic --like=tmall --output=data/synthetic/user_log_format1.csv
  # a log like the small real sample of one (../shared/data), its counts and quirks:
  python -m data.synthetic --like=tmall --sample --output=data/synthetic/user_log_format1_sample.csv
"""

from absl import app, flags

import dare_tf.cli
from dare_tf.data.generation.synthetic import SyntheticConfig, write

FLAGS = flags.FLAGS
flags.DEFINE_string("output", None, "Path of the Taobao-format CSV to write.")
flags.DEFINE_enum("like", None, ["taobao", "tmall"], "Write a log like this real one at its size "
                  "(dare_tf.data.generation.lifelike): its counts and format; the structure flags below keep their "
                  "meaning.")
flags.DEFINE_bool("string_ids", False, "Write string ids (U000001, SKU0000042, C0007, B012) and ISO 8601 times, "
                  "a log for data.prepare --string_ids.")
flags.DEFINE_bool("sample", False, "--like: the counts of the small real sample of that log (../shared/data), "
                  "with its quirks (Tmall: a user's rows out of time order, some empty brands).")
flags.DEFINE_float("fraction", 1.0, "--like: every count times this fraction.", lower_bound=0.0, upper_bound=1.0)
dare_tf.cli.define_flags(SyntheticConfig)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["output"])


# What --like sets itself (its counts, lengths and days), and the features it does not plant.
LIKE_SETS = ("users", "items", "categories", "min_length", "max_length", "length_median", "length_sigma", "days",
             "brands", "brand_interests", "p_brand", "p_recall", "recall_lag", "p_return", "extra_events")


def main(argv):
    del argv
    if FLAGS.like is not None:
        if FLAGS.string_ids:
            raise app.UsageError("--string_ids writes the generator's own log (not --like's)")
        given = [f"--{name}" for name in LIKE_SETS if FLAGS[name].present]
        if given:
            raise app.UsageError(f"--like={FLAGS.like} sets the log's counts, lengths and days itself: drop "
                                 f"{', '.join(given)}")
        from dare_tf.data.generation.lifelike import write_like

        truth = write_like(FLAGS.like, FLAGS.output, FLAGS.fraction, FLAGS.seed,
                           dare_tf.cli.from_flags(SyntheticConfig), sample=FLAGS.sample)
        counts = ", ".join(f"{v:,} {k}" for k, v in truth["counts"].items() if k != "actions")
        print(f"{FLAGS.output}: {counts} in {truth['seconds']:.0f} s; generator's own test AUC "
              f"{truth['generator_auc']:.4f}")
        return
    for name in ("fraction", "sample"):
        if FLAGS[name].present:
            raise app.UsageError(f"--{name} is for --like")
    truth = write(dare_tf.cli.from_flags(SyntheticConfig), FLAGS.output, FLAGS.string_ids)
    print(f"{FLAGS.output}: {truth['rows']} rows; generator's own test AUC {truth['generator_auc']:.4f}")


def run():
    dare_tf.cli.run(main, tensorflow=False)  # numpy only: no TensorFlow runtime


if __name__ == "__main__":
    run()
