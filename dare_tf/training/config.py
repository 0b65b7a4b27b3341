"""TrainConfig: what a training run does, and the model configuration it trains."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from dare_tf.config import ModelConfig, make_config
from dare_tf.data.negatives import format_negatives, parse_negatives
from dare_tf.data.spec import DEFAULT_SHUFFLE_BUFFER, DatasetSpec
from dare_tf.metrics import CASCADE_CANDIDATES, CASCADE_K


STRATEGIES = ("default", "mirrored", "multi_worker")
LOSSES = ("pointwise", "softmax")  # dare_tf.tasks.ClickTask
SELECTION = ("auto", "auc", f"ndcg@{CASCADE_K}", f"hit_rate@{CASCADE_K}")
OPTIMIZERS = ("adam", "lazy_adam")  # dare_tf.optimizers.make_optimizer
METRICS = ("auc", "gauc", "category_auc", "logloss")
# Behaviours per evaluation batch at most (B x L): bounds evaluation memory at long L.
EVAL_BEHAVIOURS = 1 << 22


def _check(config, checks) -> None:
    for ok, name, message in checks:
        if not ok:
            raise ValueError(f"{name}={getattr(config, name)!r}: {message}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How a run reads its examples.

    Attributes:
        eval_batch_size: evaluation batch size; at long histories capped at
            `EVAL_BEHAVIOURS // max_len` (at least `batch_size`) so that an
            evaluation batch holds at most ~4M behaviours (8192 at L <= 512).
        shuffle_buffer: examples in the shuffle buffer when the training split
            is streamed (see `in_memory_mb`).
        in_memory_mb: a split whose example columns (of this worker's
            partitions) take at most this many MB (20 bytes per example;
            histories are assembled from the sequence store per batch,
            whatever L) is read into memory once: epochs are then uniform
            permutations cut into static batches. Larger splits stream from
            their TFRecord shards through `shuffle_buffer`. 0 always streams.
    """

    eval_batch_size: int = 8192
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    in_memory_mb: int = 4096

    def __post_init__(self):
        _check(self, [(self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1"),
                      (self.shuffle_buffer >= 1, "shuffle_buffer", "must be >= 1"),
                      (self.in_memory_mb >= 0, "in_memory_mb", "must be >= 0")])


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer.

    Attributes:
        name: `adam` (dense, as the reference) or `lazy_adam` (updates only
            the embedding rows in the batch).
        learning_rate: its learning rate.
    """

    name: str = "adam"
    learning_rate: float = 0.01

    def __post_init__(self):
        _check(self, [(self.name in OPTIMIZERS, "name", f"must be one of {OPTIMIZERS}"),
                      (math.isfinite(self.learning_rate) and self.learning_rate > 0, "learning_rate",
                       "must be a finite number > 0")])


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """How long a run trains and when it evaluates.

    Attributes:
        batch_size: global training batch size.
        epochs: passes over the training split.
        eval_every: steps between validation evaluations (and checkpoints).
            None (the default): the paper's 150, or fewer so that the run
            validates at least 5 times (`dare_tf.training.diagnostics`).
        max_steps: stop each seed after this many steps (None: all epochs).
        bn_statistics_batches: before each evaluation, BatchNorm's moving
            statistics are set to the average statistics of this many training
            batches under the current weights. The moving average of training
            lags behind weights that move fast: TWIN on the demo log evaluated
            at logloss 2.60 with it, 0.29 after the refresh. 0 turns it off.
            Not used in reference mode (which evaluates with per-batch
            statistics).
    """

    batch_size: int = 2048
    epochs: int = 2
    eval_every: int | None = None
    max_steps: int | None = None
    bn_statistics_batches: int = 30

    def __post_init__(self):
        _check(self, [(self.batch_size >= 1, "batch_size", "must be >= 1"),
                      (self.epochs >= 1, "epochs", "must be >= 1"),
                      (self.eval_every is None or self.eval_every >= 1, "eval_every", "must be >= 1"),
                      (self.max_steps is None or self.max_steps >= 1, "max_steps", "must be >= 1"),
                      (self.bn_statistics_batches >= 0, "bn_statistics_batches", "must be >= 0")])


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How a run executes: nothing here changes what it computes (beyond float
    rounding), so a finished run is reused whatever these are.

    Attributes:
        strategy: `default`, `mirrored` (local devices) or `multi_worker`
            (`tf.distribute.MultiWorkerMirroredStrategy` from TF_CONFIG).
        jit_compile: compile everything after the embedding lookups with XLA.
        steps_per_execution: at most this many training steps per call of the
            compiled train function (Keras `steps_per_execution`): the trainer
            uses the largest divisor of `eval_every` up to it, so validations
            stay exactly `eval_every` steps apart. Fewer Python round trips per
            step; the same training (tested). Callbacks (the non-finite-loss
            check, TensorBoard) see every call's last step. The distributed
            path runs one step per call.
        log_every: steps between TensorBoard loss summaries.
        join_timeout_s: `multi_worker`: seconds a task waits for every task
            of TF_CONFIG's cluster to start before it ends with an error.
        verbose: 0 silent, 1 a progress bar over the run's steps with the
            validations beneath it, 2 one line per validation.
    """

    strategy: str = "default"
    jit_compile: bool = True
    steps_per_execution: int = 1
    log_every: int = 50
    join_timeout_s: int = 300
    verbose: int = 1

    def __post_init__(self):
        _check(self, [(self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}"),
                      (self.join_timeout_s >= 1, "join_timeout_s", "must be >= 1"),
                      (self.steps_per_execution >= 1, "steps_per_execution", "must be >= 1"),
                      (self.log_every >= 1, "log_every", "must be >= 1"),
                      (self.verbose in (0, 1, 2), "verbose", "must be 0, 1 or 2")])


@dataclasses.dataclass(frozen=True)
class CascadeConfig:
    """What a ranker is trained on and selected by, for a cascade
    (`dare_tf.data.negatives`, docs/two-stage.md).

    Attributes:
        negatives: the training negatives, `SOURCE:COUNT,...` of `uniform`,
            `popularity`, `category`, `retrieval`, drawn afresh each epoch per
            training click; empty (the default): the prepared dataset's own
            (the paper's protocol, for Table 1).
        retrieval_run: a `trainers.train_retrieval` run on the same dataset:
            the `retrieval` source draws from its first `candidates` merged
            candidates of each training history, and every validation and the
            test report the cascade's HitRate@10 and NDCG@10 of those
            candidates reordered by the ranker beside the paper's metrics.
        candidates: how many of the retrieval run's candidates (N).
        loss: `pointwise`, the click cross entropy of every example (the
            paper's), or `softmax`, the cross entropy of each click against its
            drawn negatives (a sampled softmax over its group; needs
            `negatives` and a batch size that is a multiple of the group).
        select_by: the validation metric whose best step's weights the run
            keeps: `auc` (the paper's), `ndcg@10` or `hit_rate@10` (the
            cascade's; need `retrieval_run`); `auto`: `ndcg@10` with a
            `retrieval_run`, else `auc`.
    """

    negatives: str = ""
    retrieval_run: str | None = None
    candidates: int = CASCADE_CANDIDATES
    loss: str = "pointwise"
    select_by: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "negatives", format_negatives(parse_negatives(self.negatives)))
        sources = [s for s, _ in parse_negatives(self.negatives)]
        _check(self, [(self.candidates >= 2, "candidates", "must be >= 2"),
                      (self.loss in LOSSES, "loss", f"must be one of {LOSSES}"),
                      (self.loss == "pointwise" or sources, "loss",
                       "softmax ranks each click against its drawn negatives: set --negatives too"),
                      (self.select_by in SELECTION, "select_by", f"must be one of {SELECTION}"),
                      (self.select_by in ("auto", "auc") or self.retrieval_run, "select_by",
                       "a cascade metric needs --retrieval_run"),
                      ("retrieval" not in sources or self.retrieval_run, "negatives",
                       "the retrieval source needs --retrieval_run")])

    @property
    def sources(self) -> tuple[tuple[str, int], ...]:
        return parse_negatives(self.negatives)

    @property
    def group(self) -> int:
        """Examples per training click: the click and its drawn negatives (1: none drawn)."""
        return 1 + sum(c for _, c in self.sources)

    @property
    def selection(self) -> str:
        """The validation metric that picks the kept weights."""
        if self.select_by != "auto":
            return self.select_by
        return f"ndcg@{CASCADE_K}" if self.retrieval_run else "auc"


SECTIONS = {"data": DataConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig, "runtime": RuntimeConfig,
            "cascade": CascadeConfig}
# A flat name (a flag, a keyword of `TrainConfig.create`) per section field, where it differs.
FLAT_NAMES = {("optimizer", "name"): "optimizer", ("cascade", "candidates"): "retrieval_candidates"}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a training run does: the model, then one section per concern.

    What identifies a run (`identity`) is everything but `runtime`.

    Attributes:
        preset: model preset (`dare_tf.PRESETS`).
        model_overrides: `ModelConfig` fields to override (dims, top_k, ...).
        seeds: one run per seed; results report mean and std.
        reference_mode: evaluate as the reference code does (BatchNorm with
            per-batch statistics, last partial batch dropped).
        data: `DataConfig`, how examples are read.
        optimizer: `OptimizerConfig`.
        schedule: `ScheduleConfig`, how long and when it evaluates.
        runtime: `RuntimeConfig`, how it executes.
        cascade: `CascadeConfig`, the negatives, loss and selection of a
            cascade's ranker.
    """

    preset: str = "dare"
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: tuple[int, ...] = (0,)
    reference_mode: bool = False
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    cascade: CascadeConfig = CascadeConfig()

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        group = self.cascade.group
        _check(self, [(len(self.seeds) >= 1, "seeds", "needs at least one seed"),
                      (len(set(self.seeds)) == len(self.seeds), "seeds", "must not repeat a seed")])
        if self.cascade.loss == "softmax" and self.schedule.batch_size % group:
            raise ValueError(f"batch_size={self.schedule.batch_size}: --loss=softmax needs a multiple of the "
                             f"group size {group} (a click and its {group - 1} negatives)")

    @classmethod
    def create(cls, **fields) -> "TrainConfig":
        """A config from flat names, as the flags spell them (`batch_size=256,
        optimizer="lazy_adam", verbose=0, ...`): each goes to its section."""
        sections = {name: {} for name in SECTIONS}
        owner = {FLAT_NAMES.get((section, f.name), f.name): (section, f.name)
                 for section, kind in SECTIONS.items() for f in dataclasses.fields(kind)}
        top = {}
        for name, value in fields.items():
            if name in owner:
                section, field = owner[name]
                sections[section][field] = value
            elif name in {f.name for f in dataclasses.fields(cls)} - set(SECTIONS):
                top[name] = value
            else:
                raise TypeError(f"TrainConfig.create: unknown field {name!r}")
        try:
            built = {name: kind(**sections[name]) for name, kind in SECTIONS.items()}
        except ValueError as e:  # name the flat field
            for (section, field), flat in FLAT_NAMES.items():
                if str(e).startswith(f"{field}=") and field in sections[section]:
                    raise ValueError(f"{flat}{str(e)[len(field):]}") from None
            raise
        return cls(**top, **built)

    def replace(self, **fields) -> "TrainConfig":
        """A copy with flat fields (as `create` takes them) changed."""
        flat = self.flat()
        flat.update(fields)
        return TrainConfig.create(**flat)

    def flat(self) -> dict[str, Any]:
        """Flat name -> value of every field (`create`'s keywords)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in SECTIONS}
        for section in SECTIONS:
            for f in dataclasses.fields(SECTIONS[section]):
                out[FLAT_NAMES.get((section, f.name), f.name)] = getattr(getattr(self, section), f.name)
        return out

    def identity(self) -> dict[str, Any]:
        """What defines a run's results: the config without its runtime part."""
        d = dataclasses.asdict(self)
        del d["runtime"]
        d["seeds"] = list(d["seeds"])
        if d["cascade"]["retrieval_run"]:
            d["cascade"]["retrieval_run"] = os.path.abspath(d["cascade"]["retrieval_run"])
        return d

    @classmethod
    def from_identity(cls, identity: dict[str, Any], **runtime) -> "TrainConfig":
        """The config a run recorded (`identity()`, its run_config.json's
        `train_config`), with `runtime` fields (`verbose=0`, ...): `identity`'s inverse."""
        flat = {name: value for name, value in identity.items() if name not in SECTIONS}
        for section, values in identity.items():
            if section in SECTIONS:
                flat.update({FLAT_NAMES.get((section, field), field): value for field, value in values.items()})
        return cls.create(**flat, **runtime)

    def execution_steps(self, every: int) -> int:
        """Steps per train-function call: the largest divisor of the run's validation
        interval `every` up to `steps_per_execution`."""
        return max(d for d in range(1, min(self.runtime.steps_per_execution, every) + 1) if every % d == 0)


def effective_model_config(config: TrainConfig, spec: DatasetSpec, strategy):
    """The `ModelConfig` a run trains: the preset, the overrides, and what the
    dataset (vocabularies, L) and the strategy (synchronised BatchNorm) imply."""
    distributed = strategy.num_replicas_in_sync > 1 or config.runtime.strategy != "default"
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
    from dare_tf.search.base import search_class  # (Keras: only once a run is configured)

    if search_class(model_config.search).keeps_top_k and model_config.top_k > model_config.max_len:
        raise ValueError(f"top_k={model_config.top_k} is larger than the history length "
                         f"max_len={model_config.max_len} of the dataset")
    return model_config


def run_identity(config: TrainConfig, model_config, spec: DatasetSpec) -> dict:
    """What defines a run's results: the training and model configurations and the dataset."""
    return {"train_config": config.identity(), "model_config": model_config.to_dict(),
            "dataset": {"name": spec.dataset, "fingerprint": spec.fingerprint()}}


def identity_check() -> dict:
    """`RunDirectory.check`'s arguments for a ranking run: a model field added after
    a run was recorded, at its default value, is the architecture the run had
    (new fields default to the earlier behaviour)."""
    return {"defaults": {**{f"model_config.{f.name}": f.default for f in dataclasses.fields(ModelConfig)},
                         **{f"train_config.cascade.{f.name}": f.default for f in dataclasses.fields(CascadeConfig)}}}
