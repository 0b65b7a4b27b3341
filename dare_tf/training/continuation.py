"""Continuing training from an earlier run (`trainers.train --init_from=RUN_DIR`)
on a dataset whose vocabularies grew: the day-by-day loop's next model.

`Continuation.load` checks the earlier run against this one before anything
is trained: a finished ranking run of the same preset and the same model
configuration (the vocabulary sizes aside), trained on a dataset whose id maps
this dataset's extend (every raw item and category keeps its dense id; new
ids come after them, as a `--split=time` preparation of more days gives
them). `Continuation.grow_into(model)` then copies its best seed's weights:

- every weight of the same shape as it is;
- each item and category table: the rows of the earlier vocabulary (padding
  and its dense ids) as they are, its out-of-vocabulary row into the new
  out-of-vocabulary row; the new ids' rows keep the new model's own
  initialisation;
- the optimizer's slots (Adam's and LazyAdam's first and second moments)
  the same way, row by row; the step counter starts at 0 (the run's
  schedule counts it), so Adam's bias correction starts again.

A model grown this way scores every (history, target) of old ids exactly as
the earlier run's model did, before any step (tested).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dare_tf.model.config import ModelConfig
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.run_directory import RunDirectory

# Vocabularies that may grow between the runs, and the id map of each.
GROWING = {"num_items": "item", "num_categories": "category"}


class ContinuationError(ValueError):
    """The earlier run cannot be continued on this dataset with this configuration."""


@dataclasses.dataclass
class Continuation:
    """An earlier run to start from: its directory, model configuration and the
    dataset it was trained on."""

    run_dir: str
    model_config: ModelConfig
    data_dir: str
    fingerprint: str

    @classmethod
    def load(cls, run_dir: str, preset: str, model_config: ModelConfig, data_dir: str) -> "Continuation":
        """Refuses (`ContinuationError`, one line) a run that cannot start this one."""
        flag = f"--init_from={run_dir}"
        try:
            identity = RunDirectory(run_dir).require("ranking")
        except (FileNotFoundError, ValueError) as e:
            raise ContinuationError(f"--init_from: {e}") from None  # (e names the directory)
        earlier_preset = identity["train_config"]["preset"]
        if earlier_preset != preset:
            raise ContinuationError(f"{flag} is a run of preset {earlier_preset!r}; this run trains {preset!r}")
        earlier = ModelConfig.from_dict(identity["model_config"])
        differ = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in GROWING
                  and getattr(earlier, f.name) != getattr(model_config, f.name)]
        if differ:
            name = differ[0]
            raise ContinuationError(f"{flag}: its model has {name}={getattr(earlier, name)!r}, this run "
                                    f"{getattr(model_config, name)!r}; a continued model keeps every setting "
                                    "but the vocabularies")
        earlier_data = RunDirectory(run_dir).results()["data_dir"]
        for field, kind in GROWING.items():
            _require_extension(flag, kind, earlier_data, data_dir)
            if getattr(model_config, field) < getattr(earlier, field):
                raise ContinuationError(f"{flag}: its {kind} vocabulary ({getattr(earlier, field)}) is larger "
                                        f"than this dataset's ({getattr(model_config, field)})")
        return cls(os.path.abspath(run_dir), earlier, os.path.abspath(earlier_data),
                   identity["dataset"]["fingerprint"])

    def identity(self) -> dict:
        """What the run identity records of where it started."""
        return {"run_dir": self.run_dir, "dataset_fingerprint": self.fingerprint}

    def grow_into(self, model) -> None:
        """Copies the earlier run's best weights (and optimizer slots) into `model`
        (built, its optimizer built), growing the vocabulary tables."""
        earlier = RunDirectory(self.run_dir).load_model()
        sizes = {(getattr(self.model_config, f), getattr(model.model_config, f)) for f in GROWING}
        for source, target in zip(earlier.weights, model.weights, strict=True):
            target.assign(_grown(np.asarray(source), np.asarray(target), sizes, target.path))
        # The moments, matched by the variable they follow (whichever of Adam and LazyAdam
        # each run used); the step counter and the learning rate are this run's own.
        slots = {_slot_key(v): v for v in getattr(earlier.optimizer, "variables", ()) if _slot_key(v)}
        for target in model.optimizer.variables:
            source = slots.get(_slot_key(target)) if _slot_key(target) else None
            if source is not None:
                target.assign(_grown(np.asarray(source), np.asarray(target), sizes, target.path))


def _slot_key(variable) -> str | None:
    """`<weight path>_momentum` / `_velocity` of an Adam slot (without the optimizer's
    name); None for any other optimizer variable."""
    name = variable.path.split("/", 1)[-1]
    return name if name.endswith(("_momentum", "_velocity")) else None


def _grown(source: np.ndarray, target: np.ndarray, sizes: set, path: str) -> np.ndarray:
    """`source` in `target`'s shape: equal shapes as is; a table of an old vocabulary
    (rows `old` of `new`) with its rows below the out-of-vocabulary row copied and that
    row moved to the new last row, the new rows `target`'s."""
    if source.shape == target.shape:
        return source
    grown = next(((old, new) for old, new in sizes if source.shape == (old, *target.shape[1:])
                  and target.shape[0] == new), None)
    if grown is None:
        raise ContinuationError(f"--init_from: weight {path} has shape {source.shape} in the earlier run, "
                                f"{target.shape} now")
    old = grown[0]
    out = target.copy()
    out[: old - 1] = source[: old - 1]
    out[-1] = source[old - 1]
    return out


def _require_extension(flag: str, kind: str, earlier_data: str, data_dir: str) -> None:
    earlier, now = read_id_map(earlier_data, kind), read_id_map(data_dir, kind)
    for dense, (a, b) in enumerate(zip(earlier, now), start=1):
        if a != b:
            where = now.index(a) + 1 if a in now else None
            raise ContinuationError(
                f"{flag}: raw {kind} {a} has dense id {dense} in its dataset ({earlier_data}) but "
                f"{where if where else 'none'} in this one; the id maps must extend the earlier ones (prepare "
                "both with --split=time, the later with more days)")
    if len(now) < len(earlier):
        raise ContinuationError(f"{flag}: its dataset has {len(earlier)} {kind} ids, this one {len(now)}")
