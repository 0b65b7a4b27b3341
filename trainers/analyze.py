r"""The paper's analysis suite on trained runs: figures, analysis.json, report.md.

Usage:
  python -m trainers.analyze --data_dir=data/prepared/taobao \
      --runs=dare:runs/dare,twin:runs/twin,din:runs/din --output_dir=runs/analysis \
      [--analyses=all|attention,retrieval,gradients,representation,convergence,dimensions] \
      [--dimension_runs=64:runs/dare_a64,32:runs/dare_a32]

Runs are `python -m trainers.train` output directories trained on --data_dir
(checked by the dataset fingerprint); the label `twin` is the convergence
reference. The gradient analysis trains its own short runs with the gradient
split; the dimension cut trains DARE at the --attention_dims that
--dimension_runs does not give, into OUT/dimension_runs/.
"""

from absl import app, flags

import dare_tf.cli
from dare_tf.analysis.config import ANALYSES, AnalysisConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "Prepared dataset the runs were trained on.")
flags.DEFINE_list("runs", [], "label:run_dir pairs (trainers.train output directories).")
flags.DEFINE_string("output_dir", None, "Where analysis.json, report.md and figures/ go.")
flags.DEFINE_list("analyses", ["all"], "all, or a subset of: attention, retrieval, gradients, representation, "
                                       "convergence, dimensions.")
flags.DEFINE_list("dimension_runs", [], "width:run_dir pairs: given DARE runs of the dimension cut.")
flags.DEFINE_list("gradient_models", ["twin", "dare"], "Presets trained with the gradient split.")
flags.mark_flags_as_required(["data_dir", "output_dir"])


def _pairs(name: str, values, key=str) -> dict:
    out = {}
    for value in values:
        label, sep, path = value.partition(":")
        if not sep or not label or not path:
            raise app.UsageError(f"--{name}: {value!r} is not label:run_dir")
        try:
            out[key(label)] = path
        except ValueError:
            raise app.UsageError(f"--{name}: {label!r} is not an integer width") from None
    return out


def configure(argv):
    """The analyses, their configuration and the runs (refused before TensorFlow loads)."""
    del argv
    analyses = ANALYSES if FLAGS.analyses == ["all"] else tuple(FLAGS.analyses)
    config = dare_tf.cli.from_flags(AnalysisConfig, gradient_presets=tuple(FLAGS.gradient_models))
    return analyses, config, _pairs("runs", FLAGS.runs), _pairs("dimension_runs", FLAGS.dimension_runs, int)


def main(configuration):
    from dare_tf.analysis.suite import run_analyses

    analyses, config, runs, dimension_runs = configuration
    result = run_analyses(FLAGS.data_dir, runs, FLAGS.output_dir, config, analyses, dimension_runs)
    print(f"wrote {FLAGS.output_dir}/analysis.json, {FLAGS.output_dir}/report.md and "
          f"{len(result['figures'])} figures")


dare_tf.cli.define_flags(AnalysisConfig, exclude=("gradient_presets",))
flags.adopt_module_key_flags(dare_tf.cli)


def run():
    dare_tf.cli.run(main, configure=configure)


if __name__ == "__main__":
    run()
