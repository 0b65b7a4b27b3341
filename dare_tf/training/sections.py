"""The sections of a `TrainConfig`, one per concern: how a run reads its data,
its optimizer, its schedule, how it executes, and a cascade's ranker."""

from __future__ import annotations

import dataclasses
import math

from dare_tf._faces import public, public_names
from dare_tf.data.feeding.negatives import format_negatives, parse_negatives
from dare_tf.data.storage.shards import DEFAULT_SHUFFLE_BUFFER
from dare_tf.metrics import CASCADE_CANDIDATES, CASCADE_K
from dare_tf.optimizers import OPTIMIZERS

STRATEGIES = ("default", "mirrored", "multi_worker", "data_parallel", "model_parallel")
# The strategies of each backend: tf.distribute's (TensorFlow) and keras.distribution's (JAX).
TF_DISTRIBUTED, JAX_DISTRIBUTED = ("mirrored", "multi_worker"), ("data_parallel", "model_parallel")
LOSSES = ("pointwise", "softmax")  # dare_tf.model.tasks.ClickTask
SELECTION = ("auto", "auc", f"ndcg@{CASCADE_K}", f"hit_rate@{CASCADE_K}")


def _check(config, checks) -> None:
    for ok, name, message in checks:
        if not ok:
            raise ValueError(f"{name}={getattr(config, name)!r}: {message}")


@public("dare_tf.training")
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
        fields: which of the dataset's further fields (spec.json's `fields`:
            a brand, a seller, the time gap) the model reads: `all`, `none`,
            or their names, comma-separated. Each gets tables of its own at
            the model's widths (`ModelConfig.fields`; a config that sets
            `fields` itself must match the dataset's).
    """

    eval_batch_size: int = 8192
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    in_memory_mb: int = 4096
    fields: str = "all"

    def __post_init__(self):
        _check(self, [(bool(self.fields.strip()), "fields", "must be all, none, or field names, comma-separated"),
                      (self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1"),
                      (self.shuffle_buffer >= 1, "shuffle_buffer", "must be >= 1"),
                      (self.in_memory_mb >= 0, "in_memory_mb", "must be >= 0")])


@public("dare_tf.training")
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
        _check(self, [(self.name in OPTIMIZERS, "name", f"must be one of {tuple(OPTIMIZERS)}"),
                      (math.isfinite(self.learning_rate) and self.learning_rate > 0, "learning_rate",
                       "must be a finite number > 0")])


@public("dare_tf.training")
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
            batches under the current weights, at most `eval_every` and the
            run's steps (a refresh reads no more batches than the steps trained
            since the last one).
            The moving average of training lags behind weights that move fast:
            TWIN on the demo log evaluated at logloss 2.60 with it, 0.29 after
            the refresh. 0 turns it off.
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


@public("dare_tf.training")
@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How a run executes: nothing here changes what it computes (beyond float
    rounding), so a finished run is reused whatever these are.

    Attributes:
        strategy: `default` (one device); on TensorFlow `mirrored` (local
            devices) or `multi_worker` (`tf.distribute.MultiWorkerMirroredStrategy`
            from TF_CONFIG); on JAX `data_parallel` (`keras.distribution.DataParallel`
            over every device) or `model_parallel` (`keras.distribution.ModelParallel`:
            the batch split over the mesh's `batch` axis, the item and category
            tables along the vocabulary over its `model` axis; docs/gpu.md).
        model_shards: `model_parallel`: devices along the mesh's `model` axis
            (0: all of them); the rest of the mesh splits the batch.
        cpu_devices (TensorFlow): split the CPU into this many logical devices
            (for --strategy=mirrored on a CPU-only machine; on JAX,
            `XLA_FLAGS=--xla_force_host_platform_device_count=N`).
        jit_compile (TensorFlow): compile everything after the embedding
            lookups with XLA; on JAX every step is one XLA function.
        steps_per_execution: at most this many training steps per call of the
            compiled train function (Keras `steps_per_execution`): the trainer
            uses the largest divisor of `eval_every` up to it, so validations
            stay exactly `eval_every` steps apart. Fewer Python round trips per
            step; the same training (tested: equal on TensorFlow, within 1e-6
            on JAX, where the N steps are one compiled program). Callbacks (the non-finite-loss
            check, TensorBoard) see every call's last step. The distributed
            path runs one step per call.
        log_every: steps between TensorBoard loss summaries.
        join_timeout_s: `multi_worker`: seconds a task waits for every task
            of TF_CONFIG's cluster to start before it ends with an error.
        compilation_cache (JAX): the folder of JAX's persistent compilation
            cache, where a run's compiled functions are kept for the next run
            of the same shapes (docs/gpu.md measures what it saves), every
            function however fast it compiled; empty: `$JAX_COMPILATION_CACHE_DIR`
            where it is set (with JAX's own size settings, as every JAX program
            writing there), else `$XDG_CACHE_HOME/dare_tf/jax`
            (`~/.cache/dare_tf/jax`); a folder of its own holds at most 1 GiB,
            the least recently used entries dropped; `none`: no cache.
            JAX runs what the cache holds: keep it a folder only you write.
        verbose: 0 silent, 1 a progress bar over the run's steps with the
            validations beneath it, 2 one line per validation.
    """

    strategy: str = "default"
    model_shards: int = 0
    cpu_devices: int = 0
    jit_compile: bool = True
    steps_per_execution: int = 1
    log_every: int = 50
    join_timeout_s: int = 300
    compilation_cache: str = ""
    verbose: int = 1

    def __post_init__(self):
        _check(self, [(self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}"),
                      (self.join_timeout_s >= 1, "join_timeout_s", "must be >= 1"),
                      (self.steps_per_execution >= 1, "steps_per_execution", "must be >= 1"),
                      (self.model_shards >= 0, "model_shards", "must be >= 0"),
                      (self.cpu_devices >= 0, "cpu_devices", "must be >= 0"),
                      (self.model_shards == 0 or self.strategy == "model_parallel", "model_shards",
                       f"splits the tables of --strategy=model_parallel only (the strategy is {self.strategy})"),
                      (self.log_every >= 1, "log_every", "must be >= 1"),
                      (self.verbose in (0, 1, 2), "verbose", "must be 0, 1 or 2")])


@public("dare_tf.training")
@dataclasses.dataclass(frozen=True)
class CascadeConfig:
    """What a ranker is trained on and selected by, for a cascade
    (`dare_tf.data.feeding.negatives`, docs/two-stage.md).

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


public_names("dare_tf.training", "STRATEGIES")
