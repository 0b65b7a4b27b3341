"""The trainer's engines, one per Keras backend: what a run does differently on
each, and nothing else (docs/gpu.md's table).

- `tensorflow` (Keras's TensorFlow backend): `DareModel.fit` over tf.data,
  `tf.distribute` placement, TensorFlow checkpoints (`loop`, `distribution`,
  `evaluator`, `prediction`, `input`);
- `jax` (Keras's JAX backend, no TensorFlow): jitted steps over input held on
  the devices or streamed from the shards, `keras.distribution` placement,
  `.npz` checkpoints (`loop`, `state`, `distribution`, `device_input`).

Everything else of a run (its schedule, validations, kept weights, history,
warnings, progress, results, run directory) is the engines' in common
(`dare_tf.training.seed_run`, `seeds`, `input_plan`, `callbacks`, ...), and only
this package asks which backend Keras runs on (`choice`; tests/test_package.py
greps).
A third engine is one more subpackage here with its `train_on_<backend>` and
its test (docs/gpu.md says what a torch one would take).
"""

from __future__ import annotations

# Each engine (`choice.engine_train`) and how `RuntimeConfig`'s docs mark a field only it reads
# (`name (JAX): ...`).
DOC_TAGS = {"tensorflow": "(TensorFlow)", "jax": "(JAX)"}
# The engine of a run recorded before its identity named one (they were all TensorFlow's).
UNRECORDED = "tensorflow"
