"""Trains the two-tower retrieval stage (tensorflow-recommenders) on a prepared dataset.

Usage:
  python -m trainers.train_retrieval --data_dir=data/prepared/taobao --output_dir=runs/retrieval

Writes OUT/results.json: recall@10/50/100/200 of the test positives against
the whole catalogue (`test`, mean over seeds; `test_std`), and the same for a
most-popular-items baseline (`test_popularity`). Started again with the same
flags, a killed run resumes after its last finished epoch; other flags on an
existing run are refused (--overwrite discards it).
"""

from absl import flags

import dare_tf.cli
from dare_tf._files import strict_json
from dare_tf.retrieval.config import RetrievalConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "Prepared dataset (python -m data.prepare).")
flags.DEFINE_string("output_dir", None, "Run directory.")
flags.DEFINE_bool("overwrite", False, "Discard a run of another configuration in --output_dir.")
dare_tf.cli.define_flags(RetrievalConfig)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["data_dir", "output_dir"])


def main(config: RetrievalConfig):
    from dare_tf.retrieval.training import train_retrieval

    results = train_retrieval(FLAGS.data_dir, FLAGS.output_dir, config, overwrite=FLAGS.overwrite,
                              flags_text=dare_tf.cli.program_flags_text())
    print(strict_json({k: results[k] for k in ("test", "test_std", "test_sources", "test_popularity", "quotas")},
                      indent=2))
    for warning in results["warnings"]:  # (under the numbers, as the trainer's undertraining warnings)
        print(f"warning: {warning}")


def run():
    dare_tf.cli.run(main, configure=lambda argv: dare_tf.cli.from_flags(RetrievalConfig), keras2=True)


if __name__ == "__main__":
    run()
