r"""Evaluates the two-stage cascade: retrieval alone, and retrieval followed by each ranker.

Usage:
  python -m trainers.evaluate_cascade --data_dir=data/prepared/taobao --retrieval_run=runs/retrieval \
      --ranking_runs=dare:runs/dare,twin:runs/twin,din:runs/din --output_dir=runs/cascade

For the test split's positive examples (a history and the item clicked next),
the retrieval run picks its top --num_candidates of the whole catalogue and
each ranker reorders them. Prints HitRate@k and NDCG@k of each stage and the
retrieval stage's recall at N, and writes OUT/cascade.json.
"""

from absl import app, flags

import dare_tf.cli

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "Prepared dataset (python -m data.prepare).")
flags.DEFINE_string("retrieval_run", None, "A finished run of python -m trainers.train_retrieval.")
flags.DEFINE_list("ranking_runs", [], "name:run_dir of finished python -m trainers.train runs.")
flags.DEFINE_string("output_dir", None, "Where cascade.json goes.")
flags.DEFINE_integer("num_candidates", 200, "N: candidates the retrieval stage hands each ranker.", lower_bound=1)
flags.DEFINE_integer("k", 10, "Cut-off of HitRate@k and NDCG@k.", lower_bound=1)
flags.DEFINE_integer("max_examples", None, "Evaluate only the first this many test positives.", lower_bound=1)
flags.DEFINE_bool("overwrite", False, "Replace an OUT/cascade.json of another configuration.")
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["data_dir", "retrieval_run", "output_dir"])


def main(argv):
    del argv
    from dare_tf.retrieval.cascade import evaluate_cascade

    runs = {}
    for entry in FLAGS.ranking_runs:
        name, sep, run_dir = entry.partition(":")
        if not sep or not name or not run_dir:
            raise app.UsageError(f"--ranking_runs entry {entry!r} is not name:run_dir")
        if name in runs:
            raise app.UsageError(f"--ranking_runs names {name!r} twice")
        runs[name] = run_dir
    evaluate_cascade(FLAGS.data_dir, FLAGS.retrieval_run, runs, FLAGS.output_dir, FLAGS.num_candidates, FLAGS.k,
                     FLAGS.max_examples, overwrite=FLAGS.overwrite)


def run():
    dare_tf.cli.run(main, keras2=True)  # (the retrieval stage: tensorflow-recommenders)


if __name__ == "__main__":
    run()
