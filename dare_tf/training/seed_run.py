"""One seed's run whatever the engine (`SeedRunBase`): the schedule's warnings,
the validations' report, the history lines, TensorBoard and the progress bar,
resuming or continuing, the kept best weights, the result and its files. An
engine's seed run (`engines.tensorflow.loop.SeedRun`, `engines.jax.loop.JaxSeedRun`)
adds only what differs: its model's compiled step (`train`), its checkpoints
(`restore`), its predictions (`predict`) and where its processes save (`save`)."""

from __future__ import annotations

import os
from typing import Callable

from absl import logging

from dare_tf.model.tasks import ClickTask
from dare_tf.run_directory import BEST_WEIGHTS, read_history
from dare_tf.training.callbacks import AppendHistory, truncate_history
from dare_tf.training.progress import RunProgress, TensorBoardScalars
from dare_tf.training.seeds import seed_result


def click_task(config) -> ClickTask:
    """The task a run's model trains on, on either engine: the click cross entropy, or with
    `--loss=softmax` the sampled softmax over each click's group of drawn negatives."""
    return ClickTask(group=config.cascade.group if config.cascade.loss == "softmax" else None)


class SeedRunBase:
    """What every engine's seed run shares. A subclass sets `data_dir`, `run_dir`,
    `work_dir`, `config`, `seed`, `spec`, `model_config`, `chief`, `continuation`,
    `plan` (`InputPlan`), `model`, `best_step`, `started` and `_print`, and
    defines `restore`, `train`, `predict` and `save`."""

    _print: Callable[[str], None]
    scalars: TensorBoardScalars | None = None  # (the chief's TensorBoard files, closed however the run ends)

    # -- what an engine defines ----------------------------------------------------------
    def restore(self) -> bool:
        """Restores the newest readable checkpoint; whether there was one."""
        raise NotImplementedError

    def train(self, step: int) -> None:
        """Trains from step `step` to the plan's last, validating and checkpointing."""
        raise NotImplementedError

    def predict(self, split: str) -> dict:
        """`predict_split`'s arrays over the whole split with the current weights."""
        raise NotImplementedError

    def save(self, result: dict, kept_step: int) -> None:
        """Writes the seed's model and result (`seeds.save_seed`)."""
        raise NotImplementedError

    def engine_title(self) -> str:
        """What the progress bar's title says of the engine (empty: nothing)."""
        return ""

    def cascade_test_metrics(self) -> dict | None:
        return None

    def weights_loaded(self) -> None:
        """After the kept weights are loaded into the model's variables."""

    # -- the run -------------------------------------------------------------------------
    def report(self, step: int, val: dict, improved: bool) -> None:
        # (the dataset by its directory: a generated log read with the taobao preset is not Taobao's;
        # "best" by the criterion that keeps the weights, AUC or a cascade metric)
        self._print(f"{self.config.preset} on {os.path.basename(self.data_dir)} seed {self.seed}, step "
                    f"{step}/{self.plan.total_steps}: validation " + " ".join(f"{k} {v:.4f}" for k, v in val.items())
                    + (f" (best {self.config.cascade.selection} so far)" if improved else ""))

    def chief_callbacks(self) -> list:
        """The chief's callbacks: history lines, TensorBoard scalars, the progress bar
        (`--verbose=1`) or the run's title and its validations' lines (`--verbose=2`)."""
        if not self.chief:
            return []
        cfg, plan = self.config, self.plan
        self.scalars = TensorBoardScalars(os.path.join(self.run_dir, "tensorboard"), cfg.runtime.log_every)
        callbacks = [AppendHistory(self.run_dir, plan.steps_per_epoch, self.started,
                                   self.report if cfg.runtime.verbose == 2 else None), self.scalars]
        title = (f"{cfg.preset} on {os.path.basename(os.path.normpath(self.data_dir))}{self.engine_title()}, seed "
                 f"{cfg.seeds.index(self.seed) + 1} of {len(cfg.seeds)} (seed {self.seed})")
        if cfg.runtime.verbose == 1:
            callbacks.append(RunProgress(title, plan.total_steps, self._print))
        elif cfg.runtime.verbose == 2 and self.engine_title():  # (the devices and the mesh, said as it starts)
            self._print(title)
        return callbacks

    def run(self) -> dict:
        """Trains (resuming from the newest checkpoint, or continuing `--init_from`)
        and returns the seed's result."""
        if not self.restore() and self.continuation is not None:
            self.continuation.grow_into(self.model)
            logging.info("seed %d: starts from %s", self.seed, self.continuation.run_dir)
        step = int(self.model.optimizer.iterations.numpy())
        if self.chief:
            truncate_history(self.run_dir, step)
        if step < self.plan.total_steps:
            if self.chief and self._print is not None and self.seed == self.config.seeds[0]:
                for warning in self.plan.warnings:  # before the run, which may be long for nothing
                    self._print(f"warning: {warning}")
            try:
                self.train(step)
            finally:  # (fit closes them at its end; a run that fails, or JAX's loop, here)
                if self.scalars is not None:
                    self.scalars.close()
        return self._finish()

    def _finish(self) -> dict:
        steps = int(self.model.optimizer.iterations.numpy())
        best = os.path.join(self.work_dir, BEST_WEIGHTS)
        kept_step = steps  # the step whose weights the result is of
        if os.path.exists(best):
            self.model.load_weights(best)  # (the optimizer's state of that step too)
            kept_step = int(self.best_step)
        self.weights_loaded()
        result = seed_result(self.seed, steps, int(self.best_step), read_history(self.run_dir),
                             lambda: self.predict("val"), self.predict("test"), self.model_config, self.plan.warnings,
                             self.plan.total_steps, self.spec, self.cascade_test_metrics())
        self.save(result, kept_step)
        return result


__all__ = ["SeedRunBase"]
