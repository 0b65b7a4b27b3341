"""TrainConfig: what a training run does, and the model configuration it trains.

Its sections (`DataConfig`, ...) are in `dare_tf.training.sections`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dare_tf._faces import public, public_names
from dare_tf.model.config import ModelConfig
from dare_tf.model.presets import make_config
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.optimizers import OPTIMIZERS
from dare_tf.training.sections import (JAX_DISTRIBUTED, LOSSES, SELECTION, STRATEGIES, TF_DISTRIBUTED, CascadeConfig,
                                       DataConfig, OptimizerConfig, RuntimeConfig, ScheduleConfig, _check)

__all__ = ["EVAL_BEHAVIOURS", "FLAT_NAMES", "JAX_DISTRIBUTED", "LOSSES", "METRICS", "OPTIMIZERS", "SECTIONS",
           "SELECTION", "STRATEGIES", "TF_DISTRIBUTED", "CascadeConfig", "DataConfig", "OptimizerConfig",
           "RuntimeConfig", "ScheduleConfig", "TrainConfig", "effective_model_config", "identity_check",
           "run_identity"]
# Vocabulary sizes of `TrainConfig.model` before a dataset gives them (`effective_model_config`).
UNSET_VOCABULARY = 2
METRICS = ("auc", "gauc", "category_auc", "logloss")
# Behaviours per evaluation batch at most (B x L): bounds evaluation memory at long L.
EVAL_BEHAVIOURS = 1 << 22


SECTIONS = {"data": DataConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig, "runtime": RuntimeConfig,
            "cascade": CascadeConfig}
# A flat name (a flag, a keyword of `TrainConfig.create`) per section field, where it differs.
FLAT_NAMES = {("optimizer", "name"): "optimizer", ("cascade", "candidates"): "retrieval_candidates"}


@public("dare_tf.training")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a training run does: the model, then one section per concern.

    What identifies a run (`identity`) is everything but `runtime`.

    `model` is the typed `ModelConfig` of `preset` with `model_overrides`,
    built (and so validated) when the config is: a bad override fails here, not
    once a dataset is read. Its vocabularies are placeholders until a dataset
    gives them, as it gives `max_len` unless overridden
    (`effective_model_config`).

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
        init_from: a finished ranking run to start from: its best weights
            and optimizer slots, grown to this dataset's vocabularies
            (`dare_tf.training.continuation`); None: a fresh model.
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
    init_from: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        group = self.cascade.group
        _check(self, [(len(self.seeds) >= 1, "seeds", "needs at least one seed"),
                      (len(set(self.seeds)) == len(self.seeds), "seeds", "must not repeat a seed")])
        if self.cascade.loss == "softmax" and self.schedule.batch_size % group:
            raise ValueError(f"batch_size={self.schedule.batch_size}: --loss=softmax needs a multiple of the "
                             f"group size {group} (a click and its {group - 1} negatives)")
        object.__setattr__(self, "_model", self._model_config(self.model_overrides.get("max_len")))

    @property
    def model(self) -> ModelConfig:
        """The typed model configuration (see the class)."""
        return self._model

    def _model_config(self, max_len: int | None, num_items: int = UNSET_VOCABULARY,
                      num_categories: int = UNSET_VOCABULARY, **derived) -> ModelConfig:
        """The preset with the overrides, at history length `max_len` (None: the
        preset's), the vocabularies and the `derived` fields."""
        overrides = dict(self.model_overrides)
        if self.reference_mode:
            overrides.setdefault("initializer", "reference")
        if max_len is not None:
            overrides.setdefault("max_len", max_len)
        if "num_positions" not in overrides:  # position ids run up to L
            default = make_config(self.preset, num_items, num_categories).num_positions
            overrides["num_positions"] = max(default, overrides.get("max_len", 0) + 1)
        overrides.update(derived)
        return make_config(self.preset, num_items, num_categories, **overrides)

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
        if d["init_from"]:
            d["init_from"] = os.path.abspath(d["init_from"])
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


@public("dare_tf.training")
def effective_model_config(config: TrainConfig, spec: DatasetSpec, strategy):
    """The `ModelConfig` a run trains: `config.model` with what the dataset
    (vocabularies, L unless overridden) and the strategy (synchronised
    BatchNorm under `tf.distribute`; `strategy` None: JAX, whose distributed
    arrays are global, so BatchNorm sees the whole batch) imply."""
    distributed = strategy is not None and (strategy.num_replicas_in_sync > 1
                                            or config.runtime.strategy in TF_DISTRIBUTED)
    fields = dataset_fields(spec, config.data.fields, config.model_overrides.get("fields"))
    if fields and config.cascade.negatives:
        raise ValueError(f"negatives={config.cascade.negatives!r}: drawn negatives have no values of the dataset's "
                         f"fields {[f['name'] for f in fields]}; train with --fields=none, or without --negatives")
    model_config = config._model_config(spec.max_len, spec.num_items, spec.num_categories,
                                        **({"fields": fields} if fields else {}),
                                        **({"synchronized_batch_norm": True} if distributed else {}))
    from dare_tf.search.registry import search_class  # (Keras: only once a run is configured)

    if search_class(model_config.search).keeps_top_k and model_config.top_k > model_config.max_len:
        raise ValueError(f"top_k={model_config.top_k} is larger than the history length "
                         f"max_len={model_config.max_len} of the dataset")
    from dare_tf.training.memory import check_step_memory

    check_step_memory(model_config, config.schedule.batch_size)
    return model_config


def dataset_fields(spec: DatasetSpec, selection: str, configured=None) -> list[dict]:
    """`ModelConfig.fields` of a run on `spec`'s dataset: the fields `selection`
    names (`DataConfig.fields`) at the model's widths; or `configured` (a
    config's own `fields`), refused in one line unless each is a dataset field
    with its vocabulary and role."""
    from dare_tf.layers.behavior_fields import BehaviorField

    available = {f["name"]: f for f in spec.fields}
    if configured:
        for field in map(BehaviorField.of, configured):
            entry = available.get(field.name)
            if entry is None or (field.vocabulary, field.history_only) != (entry["vocabulary"], entry["history_only"]):
                found = ("no such field" if entry is None else f"vocabulary {entry['vocabulary']}, history_only "
                         f"{entry['history_only']}")
                raise ValueError(f"fields: the model's field {field.name!r} (vocabulary {field.vocabulary}, "
                                 f"history_only {field.history_only}) does not match the dataset's spec.json "
                                 f"({found}; its fields: {list(available)})")
        return [dataclasses.asdict(BehaviorField.of(f)) for f in configured]
    text = selection.strip()
    names = list(available) if text == "all" else [] if text == "none" else [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"fields={selection!r}: the dataset has no field {unknown[0]!r}; its fields: "
                         f"{list(available) or 'none'} (prepare with --columns=...,field:NAME=COL, --fields, "
                         "--time_gap)")
    return [{"name": n, "vocabulary": available[n]["vocabulary"], "history_only": available[n]["history_only"]}
            for n in names]


@public("dare_tf.training")
def run_identity(config: TrainConfig, model_config, spec: DatasetSpec, continuation=None) -> dict:
    """What defines a run's results: the training and model configurations, the
    dataset and, for a continued run, the run it started from."""
    return {"train_config": config.identity(), "model_config": model_config.to_dict(),
            "dataset": {"name": spec.dataset, "fingerprint": spec.fingerprint()},
            **({"init_from": continuation.identity()} if continuation is not None else {})}


def identity_check() -> dict:
    """`RunDirectory.check`'s arguments for a ranking run: a model field added after
    a run was recorded, at its default value, is the architecture the run had
    (new fields default to the earlier behaviour)."""
    return {"defaults": {**{f"model_config.{f.name}": f.default for f in dataclasses.fields(ModelConfig)},
                         "train_config.init_from": None, "train_config.data.fields": "all",
                         **{f"train_config.cascade.{f.name}": f.default for f in dataclasses.fields(CascadeConfig)}}}


public_names("dare_tf.training", "EVAL_BEHAVIOURS", "METRICS")
