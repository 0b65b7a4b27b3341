"""RunDirectory: a run's directory on disk, the one place that knows its layout.

Training (`trainers.train`), the retrieval stage (`trainers.train_retrieval`),
the analyses, the cascade evaluation and the export all read and write runs
through it:

    output_dir/
      run_config.json     the run's identity (configuration, dataset) and kind
      flags.txt           the program's flags, a flagfile that reproduces the run
      results.json        the finished run's metrics (mean, std, per seed)
      curves.png          training curves (ranking runs)
      .lock               held by the run's writer while it runs
      tensorboard/        TensorBoard event files (`tensorboard_events.ScalarWriters`): train,
                          validation, test
      seed_N/             one seed: history.jsonl, result.json, model.keras,
                          best.weights.h5, checkpoints/ (or the towers of a
                          retrieval run)

A directory that holds entries the programs did not write is never changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil

from absl import logging

from dare_tf._faces import public
from dare_tf._files import atomic_json, guard_output_dir, lock_holder

RUN_CONFIG = "run_config.json"
RESULTS = "results.json"
FLAGS = "flags.txt"
CURVES = "curves.png"
LOCK = ".lock"  # held by the run's writer (RunDirectory.lock)
HISTORY = "history.jsonl"
SEED_RESULT = "result.json"
BEST_WEIGHTS = "best.weights.h5"
MODEL = "model.keras"
KINDS = ("ranking", "retrieval")
# The entries a run's programs write (the lock file aside, which is never removed).
_OWN = re.compile(r"seed_\d+|results\.json|run_config\.json|flags\.txt|curves\.png")


@public("dare_tf.training")
class RunConfigMismatchError(ValueError):
    """A run directory holds a run with another configuration."""


@public("dare_tf.training")
class RunLockedError(OSError):
    """Another process is training into the same run directory."""


@public("dare_tf.training")
def read_history(seed_dir: str) -> list[dict]:
    """The evaluation history of one seed's directory (one dict per evaluation)."""
    path = os.path.join(seed_dir, HISTORY)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [_metrics_as_numbers(json.loads(line)) for line in f if line.strip()]


def _metrics_as_numbers(entry: dict) -> dict:
    """A history line with its metrics as numbers again: JSON holds an undefined
    metric (NaN, e.g. GAUC without any user of both labels) as null."""
    entry["val"] = {k: math.nan if v is None else v for k, v in entry.get("val", {}).items()}
    if entry.get("train_loss", 0.0) is None:
        entry["train_loss"] = math.nan
    return entry


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _kind_of(identity: dict) -> str:
    """A recorded identity's kind; runs recorded before kinds were: by their config."""
    return identity.get("kind") or ("retrieval" if "retrieval_config" in identity else "ranking")


class RunDirectory:
    """A run's directory: identity check, lock, results, history, seeds, models, kind.

    Args:
        path: the directory (`--output_dir` of the program that trains it,
            `--run_dir` of the programs that read it).
    """

    def __init__(self, path: str):
        self.path = path

    def __repr__(self):
        return f"RunDirectory({self.path!r})"

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def seed_dir(self, seed: int) -> str:
        return os.path.join(self.path, f"seed_{seed}")

    # -- writing ------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self):
        """Holds `.lock` exclusively (`flock`) while the block runs, with the
        holder's pid in it; raises `RunLockedError` naming that pid when another
        process holds it. The kernel releases the lock of a process that dies, so
        a killed trainer's lock is taken over by the next run. A directory the
        block created and left empty (a run that failed before writing) is
        removed again, its lock file with it, while the lock is still held; so is
        a lock file it created where the block wrote nothing (a refused directory)."""
        created = not os.path.exists(self.path)
        os.makedirs(self.path, exist_ok=True)
        lock_created = not os.path.exists(self.file(LOCK))
        fd = os.open(self.file(LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(os.pread(fd, 32, 0).decode(errors="replace"))
            os.close(fd)
            raise RunLockedError(f"{self.path} is in use by another trainer ({holder}); wait for it to "
                                 "finish or choose another --output_dir") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            if lock_created and not self.own_entries():
                os.unlink(self.file(LOCK))
                if created and not os.listdir(self.path):
                    os.rmdir(self.path)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def own_entries(self) -> list[str]:
        """The entries the run's programs wrote."""
        return sorted(e for e in os.listdir(self.path) if _OWN.fullmatch(e)) if os.path.isdir(self.path) else []

    def check(self, kind: str, identity: dict, overwrite: bool = False, ignored: tuple[str, ...] = (),
              defaults: dict | None = None) -> None:
        """Refuses (`RunConfigMismatchError`) to continue a directory that holds a
        run of another kind, configuration or dataset, naming the fields that
        differ; `overwrite=True` removes that run's files (only those) instead.

        `ignored`: flattened identity keys that do not define a run (recorded
        runs may still list them). `defaults`: flattened keys added after a run
        was recorded, with the value that means the run's behaviour."""
        recorded = self.identity()
        if recorded is None:  # a new run: into a directory of its own (issue 68 (12))
            guard_output_dir(self.path, lambda entry: entry == LOCK or _OWN.fullmatch(entry), "the trainer")
        if recorded is not None:
            recorded_kind = _kind_of(recorded)
            recorded.pop("kind", None)
            old, new = _flatten(recorded), _flatten(json.loads(json.dumps(identity)))
            for key, value in (defaults or {}).items():  # (a run recorded before the key: its default, named)
                old.setdefault(key, value)
                new.setdefault(key, value)
            differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in ignored)
            if recorded_kind != kind:
                differ = ["kind"] + differ
                old["kind"], new["kind"] = recorded_kind, kind
            if not differ:
                return
            detail = "; ".join(f"{k}: {old.get(k)!r} in the run, {new.get(k)!r} now" for k in differ[:8])
            more = f" (and {len(differ) - 8} more)" if len(differ) > 8 else ""
            problem = f"{self.path} holds a run with another configuration: {detail}{more}"
        elif self.own_entries():
            problem = (f"{self.path} holds a run without {RUN_CONFIG} (written by an older version): "
                       f"{', '.join(repr(e) for e in self.own_entries())}; its configuration cannot be checked")
        else:
            return
        if not overwrite:
            raise RunConfigMismatchError(f"{problem}. Use another output directory, or --overwrite to "
                                         "discard that run")
        for entry in self.own_entries():
            target = self.file(entry)
            shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
        logging.warning("%s: discarded the previous run (--overwrite)", self.path)

    def start(self, kind: str, identity: dict, flags_text: str | None = None) -> None:
        """Records the run's kind and identity (and the program's flags)."""
        if kind not in KINDS:
            raise ValueError(f"RunDirectory.start: kind={kind!r} is not one of {KINDS}")
        os.makedirs(self.path, exist_ok=True)
        atomic_json(self.file(RUN_CONFIG), {"kind": kind, **identity})
        if flags_text is not None:
            with open(self.file(FLAGS), "w") as f:
                f.write(flags_text)

    def write_results(self, results: dict) -> None:
        atomic_json(self.file(RESULTS), results)

    # -- reading ------------------------------------------------------------------
    def identity(self) -> dict | None:
        """`run_config.json`, or `None` where there is none."""
        if not os.path.exists(self.file(RUN_CONFIG)):
            return None
        with open(self.file(RUN_CONFIG)) as f:
            return json.load(f)

    @property
    def kind(self) -> str:
        """`ranking` (`trainers.train`) or `retrieval` (`trainers.train_retrieval`),
        as the run recorded it (runs recorded before the kind was: by their config)."""
        identity = self.identity()
        if identity is None:
            raise FileNotFoundError(f"{self.file(RUN_CONFIG)} not found: is {self.path!r} a run of "
                                    "python -m trainers.train or trainers.train_retrieval?")
        return _kind_of(identity)

    def require(self, kind: str, fingerprint: str | None = None, label: str | None = None) -> dict:
        """The identity of a finished run of `kind` (trained on the dataset of
        `fingerprint`, where given); one-line errors otherwise."""
        name = f"run {label!r} ({self.path})" if label else self.path
        for file in (RUN_CONFIG, RESULTS):
            if not os.path.exists(self.file(file)):
                raise FileNotFoundError(f"{name}: {self.file(file)} not found; is it a finished run of "
                                        f"python -m trainers.{'train' if kind == 'ranking' else 'train_retrieval'}?")
        if self.kind != kind:
            raise ValueError(f"{name} is a {self.kind} run, not a {kind} run")
        identity = self.identity()
        trained_on = identity.get("dataset", {}).get("fingerprint")
        if fingerprint is not None and trained_on != fingerprint:
            raise ValueError(f"{name} was trained on another dataset (fingerprint {trained_on}, not {fingerprint})")
        return identity

    def results(self) -> dict:
        if not os.path.exists(self.file(RESULTS)):
            raise FileNotFoundError(f"{self.file(RESULTS)} not found: is {self.path!r} a finished run?")
        with open(self.file(RESULTS)) as f:
            return json.load(f)

    def history(self, seed: int) -> list[dict]:
        return read_history(self.seed_dir(seed))

    def best_seed(self) -> int:
        """The seed with the highest validation AUC (ranking runs)."""
        return int(max(self.results()["per_seed"], key=lambda r: r["val"]["auc"])["seed"])

    def load_model(self, seed: int | None = None):
        """A ranking run's `model.keras` of `seed` (default: the best seed), its
        layers, search and optimizer registered first (`dare_tf.load`)."""
        import keras

        import dare_tf

        dare_tf.load()
        seed = self.best_seed() if seed is None else seed
        return keras.saving.load_model(os.path.join(self.seed_dir(seed), MODEL))

    def trained_model(self, fingerprint: str, label: str | None = None):
        """The model (first seed) of a finished ranking run trained on the dataset
        of `fingerprint`; one-line errors for another dataset or an unfinished run."""
        self.require("ranking", fingerprint, label)
        return self.load_model(self.results()["seeds"][0])
