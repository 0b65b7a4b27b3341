"""Prepares a raw Taobao or Tmall click log as a dataset (the paper's protocol).

Usage:
  python -m data.prepare --dataset=taobao --input=UserBehavior.csv --output_dir=data/prepared/taobao
  python -m data.prepare ... --runner=beam [--beam_options="--runner=DataflowRunner --project=..."]

--runner=beam runs the same protocol as an Apache Beam pipeline (DirectRunner
unless --beam_options name another runner) and writes the same files.

--output_dir is replaced only when it is absent, empty or a dataset this program wrote.
"""

import os

os.environ.setdefault("DARE_TF_DATA_ONLY", "1")  # numpy and pyarrow only: no TensorFlow runtime (memory)

from absl import flags  # noqa: E402

import dare_tf.cli  # noqa: E402
from dare_tf.data.logs import FORMATS  # noqa: E402
from dare_tf.data.protocol import Protocol, prepare  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("dataset", None, sorted(FORMATS), "Format of the raw log.")
flags.DEFINE_string("input", None, "Raw log: UserBehavior.csv or user_log_format1.csv.")
flags.DEFINE_string("output_dir", None, "Directory to write (see above).")
flags.DEFINE_bool("skip_bad_lines", False, "Skip and count malformed lines instead of stopping.")
flags.DEFINE_enum("runner", "in_memory", ["in_memory", "beam"],
                  "in_memory: one process; beam: an Apache Beam pipeline (same output).")
flags.DEFINE_string("beam_options", "", "Beam pipeline options, space-separated (--runner=beam only).")
dare_tf.cli.define_flags(Protocol)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["dataset", "input", "output_dir"])


def main(argv):
    del argv
    protocol = dare_tf.cli.from_flags(Protocol)
    if FLAGS.runner == "beam":
        from apache_beam.options.pipeline_options import PipelineOptions

        from dare_tf.data import beam

        options = PipelineOptions(FLAGS.beam_options.split() or ["--runner=DirectRunner"])
        spec = beam.prepare(FLAGS.dataset, FLAGS.input, FLAGS.output_dir, protocol, FLAGS.skip_bad_lines, options)
    else:
        spec = prepare(FLAGS.dataset, FLAGS.input, FLAGS.output_dir, protocol, FLAGS.skip_bad_lines)
    print(f"{FLAGS.output_dir}: {spec.users} users, {spec.num_items - 2} items, "
          f"{spec.num_categories - 2} categories, examples {spec.counts}")


def run():
    dare_tf.cli.run(main)


if __name__ == "__main__":
    run()
