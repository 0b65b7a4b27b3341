"""A seed's input plan: which examples each step of a run reads, on every worker."""

from __future__ import annotations

import math

import numpy as np

from dare_tf._faces import public
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.model.inputs import input_keys
from dare_tf.training.config import TF_DISTRIBUTED, TrainConfig
from dare_tf.training.diagnostics import default_eval_every, schedule_warnings
from dare_tf.training.workers import worker_index, worker_partitions
from dare_tf.training.reranking import Cascade


@public("dare_tf.training")
class InputPlan:
    """The steps of one seed's run and the batches each reads.

    Each worker reads its own partitions (users) of every split: per-worker
    input and store memory ~1/W. Every worker runs the same steps per epoch:
    the fewest full local batches any worker's partitions hold (the rest of a
    larger partition set is left out of that epoch, a different rest each
    epoch as the order is reshuffled). A split in `memory` is read from it:
    epochs are uniform permutations cut into static batches; otherwise it
    streams from its shards.

    Attributes:
        steps_per_epoch, total_steps, eval_every: the run's schedule.
        bn_statistics_batches: the training batches each BatchNorm refresh
            reads: `--bn_statistics_batches`, at most `eval_every` and `total_steps`.
        worker, workers, partitions, local_batch: this worker's share.
        memory: the splits read from memory (`InMemorySplit`), by name.
        warnings: the schedule's warnings (`diagnostics.schedule_warnings`).
    """

    def __init__(self, data_dir: str, config: TrainConfig, seed: int, spec: DatasetSpec, strategy, max_len: int,
                 memory: dict[str, InMemorySplit] | None = None, cascade: Cascade | None = None, fields=()):
        self.data_dir, self.config, self.seed, self.spec, self.strategy = data_dir, config, seed, spec, strategy
        self.max_len = max_len
        self.input_keys = input_keys(fields)  # (the model's: a dataset may hold fields it does not read)
        self.memory = dict(memory or {})
        if cascade is not None and cascade.sampler is not None:  # this seed's drawn negatives, every epoch
            self.memory["train"] = cascade.train_split(seed, config.schedule.epochs, max_len)
        # (strategy None: the trainer on JAX, one process whose arrays keras.distribution places)
        self.distributed = strategy is not None and (strategy.num_replicas_in_sync > 1
                                                     or config.runtime.strategy in TF_DISTRIBUTED)
        batch = config.schedule.batch_size
        if self.distributed and batch % strategy.num_replicas_in_sync:
            raise ValueError(f"batch_size={batch} must be divisible by the {strategy.num_replicas_in_sync} replicas")
        self.worker, self.workers = worker_index(strategy)
        self.partitions = worker_partitions(spec, self.worker, self.workers)
        self.local_batch = batch // self.workers
        if self.workers > 1:
            if batch % self.workers:
                raise ValueError(f"batch_size={batch} must be divisible by the {self.workers} workers")
            counts = [sum(spec.records(n) for n in spec.shard_files("train", worker_partitions(spec, w, self.workers)))
                      for w in range(self.workers)]
            if cascade is not None and cascade.sampler is not None:  # each click with its drawn negatives
                counts = [c // (1 + spec.protocol["negatives"]) * config.cascade.group for c in counts]
            self.steps_per_epoch = min(counts) // self.local_batch
            self.total_steps = self.steps_per_epoch * config.schedule.epochs
            examples = sum(counts)
        else:
            examples = self.memory["train"].per_epoch if "train" in self.memory else spec.counts["train"]
            # In memory, the epochs' permutations run back to back, cut into full batches
            # (static shapes: LazyAdam's step ran 2x faster with them); streamed, every
            # epoch ends with its partial batch, dropped when distributed and on JAX (strategy
            # None: a jitted step's shapes are static).
            self.steps_per_epoch = (examples // batch if self.distributed or "train" in self.memory
                                    or strategy is None else math.ceil(examples / batch))
            self.total_steps = (config.schedule.epochs * examples // batch if "train" in self.memory
                                else self.steps_per_epoch * config.schedule.epochs)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{data_dir}: the train split has fewer examples ({spec.counts['train']}"
                             f"{'' if self.workers == 1 else ' over all workers; the fewest on one worker'}) "
                             f"than one batch ({self.local_batch} per {'worker' if self.workers > 1 else 'step'})")
        self.warnings = [] if config.schedule.max_steps is not None else schedule_warnings(
            self.total_steps, examples, batch, config.schedule.epochs)
        if config.schedule.max_steps is not None:
            self.total_steps = min(self.total_steps, config.schedule.max_steps)
        self.eval_every = config.schedule.eval_every or default_eval_every(self.total_steps)
        # (at most the steps between two validations, or the run's where it is shorter: a refresh never
        # reads more batches than were trained since the last one, where a short run's refreshes
        # outweighed its training)
        self.bn_statistics_batches = min(config.schedule.bn_statistics_batches, self.eval_every, self.total_steps)

    def _permutation(self, epoch: int) -> np.ndarray:
        return self.memory["train"].epoch_order(self.seed, epoch)

    def memory_order(self, skip: int) -> np.ndarray:
        """A split held in memory: the example indices of steps `skip` to
        `total_steps`, in training order (the epochs' permutations back to back)."""
        batch, epochs = self.local_batch, self.config.schedule.epochs
        # Examples per epoch: the whole split, or a worker's equal share.
        per_epoch = self.steps_per_epoch * batch if self.workers > 1 else self.memory["train"].per_epoch
        first = skip * batch // per_epoch
        last = min(epochs, -(-self.total_steps * batch // per_epoch))  # (the epochs the steps reach: max_steps)
        order = np.concatenate([self._permutation(e)[:per_epoch] for e in range(first, last)])
        start = skip * batch - first * per_epoch
        return order[start: start + (self.total_steps - skip) * batch]
