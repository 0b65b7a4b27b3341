"""Training and evaluation: resumable, multi-seed, optionally distributed, one
trainer over two engines (`engines`, docs/gpu.md's table): Keras's TensorFlow
backend (`engines.tensorflow`: `DareModel.fit` over tf.data, tf.distribute,
TensorFlow checkpoints) or its JAX backend (`engines.jax`: jitted steps over
device-held or streamed input, keras.distribution, `.npz` checkpoints, no
TensorFlow), one seed's run shared by both (`seed_run.SeedRunBase`). `train(data_dir, output_dir,
TrainConfig(...))` trains one model per seed on a prepared dataset with these
callbacks (`dare_tf.training.callbacks`):

- every `eval_every` steps (a Keras "epoch" here is `eval_every` steps of one
  continuous input stream) and at the end: `ExactValidation` refreshes
  BatchNorm's statistics and computes the exact validation metrics (AUC, GAUC,
  category AUC, logloss), `KeepBestWeights` keeps the best-on-validation
  weights, `AppendHistory` appends the metric history, `SaveCheckpoint` writes
  a checkpoint;
- `StopOnNonFiniteLoss`: stops with `NonFiniteLossError` naming the step;
- `StopAtStep`: ends training after `epochs` passes (or `max_steps`);
- `TensorBoardScalars` and `RunProgress` (`dare_tf.training.progress`):
  TensorBoard event files and the progress bar.

The callbacks talk through Keras's logs (`val_auc`, ...) only.

Test metrics of the best weights, overall and by history length, go to
`output_dir/results.json` (mean, std and per-seed values); the directory's
layout is `dare_tf.run_directory.RunDirectory`'s.

Kill-safety: a run directory records its full effective configuration and
the dataset's fingerprint (`run_config.json`); started again with the same
configuration, each seed restores its latest checkpoint, drops history
lines after it and continues the same input stream (fixed per seed and
epoch) from the next batch; finished seeds are reused. Another configuration
is refused with the fields that differ, unless `overwrite=True`.

Modules, one concern each: `config` (TrainConfig, its typed model config and
the run's identity), `sections` (TrainConfig's sections), `workers` (which
worker a process is and its partitions), `evaluation` (the metrics of a
split's predictions), `reranking` (a ranker inside its cascade: drawn
negatives and the cascade's metrics), `input_plan` (which batches each step of
a seed reads), `callbacks`, `progress`, `program_flags` (the trainers' flags),
`seed_run` (one seed's run over either engine), `seeds` (a run over its
seeds), `checkpoints` (resuming from the newest checkpoint that reads),
`engines` (what differs by backend, and the only place that asks which) and
`trainer` (`train`, which runs the engine of Keras's backend).

Importing this package costs nothing: each name is imported from its module on
first use (`config` needs no TensorFlow, so a program's flags are defined and
parsed before TensorFlow loads).
"""

from dare_tf._faces import face_of, lazy_face

_SUBMODULES = ("callbacks", "checkpoints", "config", "engines", "evaluation", "input_plan", "progress",
               "program_flags", "reranking", "seed_run", "seeds", "sections", "trainer", "workers")

__getattr__, __dir__, __all__ = lazy_face(__name__, face_of(__name__), _SUBMODULES)
