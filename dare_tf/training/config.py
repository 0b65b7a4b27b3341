"""TrainConfig: what a training run does, and the model configuration it trains."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dare_tf.config import ModelConfig, make_config
from dare_tf.data.pipeline import DEFAULT_SHUFFLE_BUFFER
from dare_tf.data.spec import DatasetSpec
from dare_tf.search import search_class


STRATEGIES = ("default", "mirrored", "multi_worker")


OPTIMIZERS = ("adam", "lazy_adam")


METRICS = ("auc", "gauc", "category_auc", "logloss")


# Settings that change what a run prints, not what it computes.
# TrainConfig fields that do not change what a run computes (tested for
# steps_per_execution): a finished run is reused whatever their values.
PRESENTATION_FIELDS = ("verbose", "steps_per_execution")


# Behaviours per evaluation batch at most (B x L): bounds evaluation memory at long L.
EVAL_BEHAVIOURS = 1 << 22


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a training run does.

    Attributes:
        preset: model preset (`dare_tf.PRESETS`).
        model_overrides: `ModelConfig` fields to override (dims, top_k, ...).
        batch_size: global training batch size.
        eval_batch_size: evaluation batch size; at long histories capped at
            `EVAL_BEHAVIOURS // max_len` (at least `batch_size`) so that an
            evaluation batch holds at most ~4M behaviours (8192 at L <= 512).
        learning_rate: Adam learning rate.
        epochs: passes over the training split.
        seeds: one run per seed; results report mean and std.
        eval_every: steps between validation evaluations (and checkpoints).
        optimizer: `adam` (dense, as the reference) or `lazy_adam` (updates
            only the embedding rows in the batch).
        reference_mode: evaluate as the reference code does (BatchNorm with
            per-batch statistics, last partial batch dropped).
        strategy: `default`, `mirrored` (local devices) or `multi_worker`
            (`tf.distribute.MultiWorkerMirroredStrategy` from TF_CONFIG).
        jit_compile: compile everything after the embedding lookups with XLA.
        max_steps: stop each seed after this many steps (None: all epochs).
        shuffle_buffer: examples in the shuffle buffer when the training split
            is streamed (see `in_memory_mb`).
        in_memory_mb: a split whose example columns (of this worker's
            partitions) take at most this many MB (20 bytes per example;
            histories are assembled from the sequence store per batch,
            whatever L) is read into memory once: epochs are then uniform
            permutations cut into static batches. Larger splits stream from
            their TFRecord shards through `shuffle_buffer`. 0 always streams.
        log_every: steps between TensorBoard loss summaries.
        bn_statistics_batches: before each evaluation, BatchNorm's moving
            statistics are set to the average statistics of this many training
            batches under the current weights. The moving average of training
            lags behind weights that move fast: TWIN on the demo log evaluated
            at logloss 2.60 with it, 0.29 after the refresh. 0 turns it off.
            Not used in reference mode (which evaluates with per-batch
            statistics).
        steps_per_execution: at most this many training steps per call of the
            compiled train function (Keras `steps_per_execution`): the trainer
            uses the largest divisor of `eval_every` up to it, so validations
            stay exactly `eval_every` steps apart. Fewer Python round trips per
            step; the same training (tested), but no measurable speed-up on 2
            CPU cores (README, Benchmarks). Callbacks (the non-finite-loss
            check, TensorBoard) see every call's last step. The distributed
            path runs one step per call.
        verbose: 0 silent, 1 Keras progress bar, 2 one line per evaluation.
    """

    preset: str = "dare"
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 2048
    eval_batch_size: int = 8192
    learning_rate: float = 0.01
    epochs: int = 2
    seeds: tuple[int, ...] = (0,)
    eval_every: int = 150
    optimizer: str = "adam"
    reference_mode: bool = False
    strategy: str = "default"
    jit_compile: bool = True
    max_steps: int | None = None
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    in_memory_mb: int = 4096
    log_every: int = 50
    bn_statistics_batches: int = 30
    steps_per_execution: int = 1
    verbose: int = 1

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        checks = [
            (self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {OPTIMIZERS}"),
            (self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}"),
            (self.batch_size >= 1, "batch_size", "must be >= 1"),
            (self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1"),
            (math.isfinite(self.learning_rate) and self.learning_rate > 0, "learning_rate",
             "must be a finite number > 0"),
            (self.epochs >= 1, "epochs", "must be >= 1"),
            (self.eval_every >= 1, "eval_every", "must be >= 1"),
            (self.max_steps is None or self.max_steps >= 1, "max_steps", "must be >= 1"),
            (self.shuffle_buffer >= 1, "shuffle_buffer", "must be >= 1"),
            (self.in_memory_mb >= 0, "in_memory_mb", "must be >= 0"),
            (self.log_every >= 1, "log_every", "must be >= 1"),
            (self.bn_statistics_batches >= 0, "bn_statistics_batches", "must be >= 0"),
            (self.steps_per_execution >= 1, "steps_per_execution", "must be >= 1"),
            (self.verbose in (0, 1, 2), "verbose", "must be 0, 1 or 2"),
            (len(self.seeds) >= 1, "seeds", "needs at least one seed"),
            (len(set(self.seeds)) == len(self.seeds), "seeds", "must not repeat a seed"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: {message}")

    @property
    def execution_steps(self) -> int:
        """Steps per train-function call: the largest divisor of `eval_every` up to `steps_per_execution`."""
        return max(d for d in range(1, min(self.steps_per_execution, self.eval_every) + 1) if self.eval_every % d == 0)


def effective_model_config(config: TrainConfig, spec: DatasetSpec, strategy):
    """The `ModelConfig` a run trains: the preset, the overrides, and what the
    dataset (vocabularies, L) and the strategy (synchronised BatchNorm) imply."""
    distributed = strategy.num_replicas_in_sync > 1 or config.strategy != "default"
    overrides = dict(config.model_overrides)
    if config.reference_mode:
        overrides.setdefault("initializer", "reference")
    overrides.setdefault("max_len", spec.max_len)
    if "num_positions" not in overrides:  # position ids run up to L
        default = make_config(config.preset, spec.num_items, spec.num_categories).num_positions
        overrides["num_positions"] = max(default, overrides["max_len"] + 1)
    if distributed:
        overrides["synchronized_batch_norm"] = True
    model_config = make_config(config.preset, spec.num_items, spec.num_categories, **overrides)
    if search_class(model_config.search).keeps_top_k and model_config.top_k > model_config.max_len:
        raise ValueError(f"top_k={model_config.top_k} is larger than the history length "
                         f"max_len={model_config.max_len} of the dataset")
    return model_config


def run_identity(config: TrainConfig, model_config, spec: DatasetSpec) -> dict:
    """What defines a run's results: the training and model configurations and the dataset."""
    train = {k: v for k, v in dataclasses.asdict(config).items() if k not in PRESENTATION_FIELDS}
    train["seeds"] = list(train["seeds"])
    return {"train_config": train, "model_config": model_config.to_dict(),
            "dataset": {"name": spec.dataset, "fingerprint": spec.fingerprint()}}


def identity_check() -> dict:
    """`RunDirectory.check`'s arguments for a ranking run: presentation fields do not
    define a run (runs recorded before a field became one still list it), and a
    model field added after a run was recorded, at its default value, is the
    architecture the run had (new fields default to the earlier behaviour)."""
    return {"ignored": tuple(f"train_config.{f}" for f in PRESENTATION_FIELDS),
            "defaults": {f"model_config.{f.name}": f.default for f in dataclasses.fields(ModelConfig)}}
