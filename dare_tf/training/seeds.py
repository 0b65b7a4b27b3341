"""A run over its seeds, on either engine: the run directory's check and start,
each seed trained (as the engine's loop says, `dare_tf.training.engines`) or its
finished result reused, a seed's result, and the run's `results.json`. No
TensorFlow."""

from __future__ import annotations

import json
import os
from typing import Callable

from absl import logging

from dare_tf.data.storage.spec import DatasetSpec
from dare_tf._files import atomic_json, require_space, variables_bytes
from dare_tf.run_directory import MODEL, SEED_RESULT, RunDirectory
from dare_tf.tensorboard_events import ScalarWriters
from dare_tf.training.config import TrainConfig, identity_check, run_identity
from dare_tf.training.diagnostics import run_warnings, seed_warnings
from dare_tf.training.engines import UNRECORDED
from dare_tf.training.evaluation import evaluate_outputs, metrics_by_history_length, summarize


def run_seeds(data_dir: str, output_dir: str, config: TrainConfig, spec: DatasetSpec, model_config, chief: bool,
              overwrite: bool, flags_text: str | None, continuation, train_seed: Callable[[int, str], dict],
              backend: str) -> dict:
    """Checks and starts `output_dir` (the chief), then each seed of `config`:
    its `seed_<n>/` result where it finished, else `train_seed(seed, seed_dir)`;
    writes and returns the run's results. `backend` joins the run's identity
    (a run is resumed only on the backend that started it; a run recorded
    before the field is `engines.UNRECORDED`'s)."""
    identity = {**run_identity(config, model_config, spec, continuation), "backend": backend}
    run_directory = RunDirectory(output_dir)
    if chief:
        check = identity_check()
        check["defaults"]["backend"] = UNRECORDED
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


def save_seed(run_dir: str, model, result: dict, kept_step: int, config: TrainConfig, model_config, seed: int) -> None:
    """A finished seed's outputs, on any backend (the chief): the test metrics under
    `tensorboard/test/` at `kept_step` (the kept weights' step), the run's
    hyperparameters for TensorBoard's HParams dashboard, `model.keras`, then
    `result.json` (its presence marks the seed finished)."""
    with ScalarWriters(os.path.join(run_dir, "tensorboard")) as writers:
        writers.write("test", result["test"], kept_step)
        writers.hparams({**{f"train.{k}": v for k, v in config.flat().items() if k != "model_overrides"},
                         **{f"model.{k}": v for k, v in model_config.to_dict().items()}, "seed": seed})
    require_space(run_dir, variables_bytes(model.weights), f"the trained model ({MODEL})")
    model.save(os.path.join(run_dir, MODEL))
    atomic_json(os.path.join(run_dir, SEED_RESULT), result)


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
