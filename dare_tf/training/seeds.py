"""A run over its seeds, on any backend: `train`, the trainer's entry, which
hands the run to `dare_tf.training.loop` on TensorFlow or
`dare_tf.training.jax_loop` on JAX; the run directory's check and start, each
seed trained (as the backend's loop says) or its finished result reused, a
seed's result, and the run's `results.json`. No TensorFlow."""

from __future__ import annotations

import json
import os
from typing import Callable

from absl import logging

from dare_tf._faces import public
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.run_directory import SEED_RESULT, RunDirectory
from dare_tf.training.config import TrainConfig, identity_check, run_identity
from dare_tf.training.diagnostics import run_warnings, seed_warnings
from dare_tf.training.evaluation import evaluate_outputs, metrics_by_history_length, summarize


@public("dare_tf.training")
def train(data_dir: str, output_dir: str, config: TrainConfig, strategy=None, overwrite: bool = False,
          report: Callable[[str], None] = print, flags_text: str | None = None) -> dict:
    """Trains every seed of `config` (resuming or reusing finished ones) and
    writes `output_dir/results.json`; returns its content. On Keras's TensorFlow
    backend under `strategy` (a `tf.distribute` strategy; default: the
    configuration's, `dare_tf.training.loop`); on JAX with no TensorFlow, the
    configuration's `keras.distribution` (`dare_tf.training.jax_loop`).

    `report` receives the progress lines (`verbose` 1 and 2); `flags_text`, the
    program's effective flags, is written to `output_dir/flags.txt` (a flagfile
    that reproduces the run)."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        if strategy is not None:
            raise ValueError("a tf.distribute strategy was given to the trainer on JAX: pass none, and set "
                             "--strategy=data_parallel or model_parallel (keras.distribution)")
        from dare_tf.training.jax_loop import train_on_jax

        return train_on_jax(data_dir, output_dir, config, overwrite, report, flags_text)
    if backend != "tensorflow":
        raise ValueError(f"the trainer runs on Keras's TensorFlow or JAX backend; KERAS_BACKEND is {backend!r}: "
                         "set it to jax or unset it, or train with DareModel's own compile/fit on that backend "
                         "(docs/library.md)")
    from dare_tf.training.loop import train_on_tensorflow

    return train_on_tensorflow(data_dir, output_dir, config, strategy, overwrite, report, flags_text)


def run_seeds(data_dir: str, output_dir: str, config: TrainConfig, spec: DatasetSpec, model_config, chief: bool,
              overwrite: bool, flags_text: str | None, continuation, train_seed: Callable[[int, str], dict],
              backend: str = "tensorflow") -> dict:
    """Checks and starts `output_dir` (the chief), then each seed of `config`:
    its `seed_<n>/` result where it finished, else `train_seed(seed, seed_dir)`;
    writes and returns the run's results. `backend` joins the run's identity
    (a run is resumed only on the backend that started it; TensorFlow's is the
    identity of runs recorded before the field)."""
    identity = run_identity(config, model_config, spec, continuation)
    if backend != "tensorflow":
        identity["backend"] = backend
    run_directory = RunDirectory(output_dir)
    if chief:
        check = identity_check()
        check["defaults"]["backend"] = "tensorflow"
        run_directory.check("ranking", identity, overwrite, **check)
        run_directory.start("ranking", identity, flags_text)
    per_seed = []
    for seed in config.seeds:
        run_dir = os.path.join(output_dir, f"seed_{seed}")
        done = os.path.join(run_dir, SEED_RESULT)
        if os.path.exists(done):
            with open(done) as f:
                per_seed.append(json.load(f))
            logging.info("seed %d: already finished, reusing %s", seed, done)
            continue
        per_seed.append(train_seed(seed, run_dir))
    results = {"data_dir": os.path.abspath(data_dir), "dataset": spec.dataset, "config": identity["train_config"],
               "seeds": list(config.seeds), **summarize(per_seed), "per_seed": per_seed,
               "warnings": run_warnings(per_seed)}
    if chief:
        run_directory.write_results(results)
    return results


def trainable_spec(data_dir: str) -> DatasetSpec:
    """The dataset's spec, refused where a ranker has nothing to learn from it."""
    spec = DatasetSpec.load(data_dir)
    impressions = any(role == "label" for role, _ in spec.source.get("log", {}).get("columns", []))
    if spec.protocol.get("negatives") == 0 and not impressions:
        raise ValueError(f"{data_dir} was prepared with --negatives=0 from a click log: every example is a "
                         "click, so a ranker has nothing to tell apart and AUC is undefined; prepare it with "
                         "--negatives >= 1 (that dataset suits retrieval: trainers.train_retrieval)")
    return spec


def seed_result(seed: int, steps: int, best_step: int, history: list[dict], val: Callable[[], dict],
                test: dict, model_config, plan_warnings: list[str], total_steps: int, spec: DatasetSpec,
                cascade_test: dict | None = None) -> dict:
    """A seed's `seed_result.json`: its steps, the kept weights' step, their
    validation metrics (the history's line of that step, else `val()`'s
    outputs), test metrics overall and by history length, its warnings."""
    best_entry = next((h for h in history if h["step"] == best_step), None)
    return {
        "seed": seed,
        "steps": steps,
        "best_step": best_step,
        "val": best_entry["val"] if best_entry else evaluate_outputs(val()),
        "test": evaluate_outputs(test),
        **({"test_cascade": cascade_test} if cascade_test is not None else {}),
        "test_by_history_length": metrics_by_history_length(test, model_config.max_len),
        "model_config": model_config.to_dict(),
        "warnings": plan_warnings + seed_warnings(history, total_steps, spec),
    }
