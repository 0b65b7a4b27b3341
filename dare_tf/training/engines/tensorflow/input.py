"""The TensorFlow engine's input: an `InputPlan`'s batches as tf.data
datasets, distributed under a `tf.distribute` strategy."""

from __future__ import annotations

import tensorflow as tf

from dare_tf._faces import public
from dare_tf.training.input_plan import InputPlan


@public("dare_tf.training")
class TensorFlowInput(InputPlan):
    """`InputPlan` read through tf.data: each epoch's batches and the training
    stream from any step, each worker's own partitions."""

    def epoch_batches(self, epoch: int, shuffle_buffer: int | None = None):
        """Training batches of one pass over this worker's partitions, in an order
        fixed by seed and epoch (`steps_per_epoch` local batches)."""
        if "train" in self.memory:
            order = self._permutation(epoch)[: self.steps_per_epoch * self.local_batch if self.workers > 1 else None]
            return self.memory["train"].batches(order, self.local_batch)
        from dare_tf.data.feeding.pipeline import make_dataset

        return make_dataset(self.data_dir, "train", self.local_batch, shuffle=True,
                            shuffle_buffer=shuffle_buffer or self.config.data.shuffle_buffer, deterministic=True,
                            seed=self.seed * 1000 + epoch, spec=self.spec, partitions=self.partitions,
                            drop_remainder=self.distributed, max_len=self.max_len).take(self.steps_per_epoch)

    def train_stream(self, skip: int):
        """All training batches from step `skip` on, features and label; distributed,
        each input pipeline (worker) reads its own partitions."""
        batch, epochs = self.local_batch, self.config.schedule.epochs
        if "train" in self.memory:
            ds = self.memory["train"].batches(self.memory_order(skip), batch)
        else:
            first = skip // self.steps_per_epoch
            ds = self.epoch_batches(first).skip(skip - first * self.steps_per_epoch)
            for epoch in range(first + 1, min(epochs, -(-self.total_steps // self.steps_per_epoch))):
                ds = ds.concatenate(self.epoch_batches(epoch))
            ds = ds.take(self.total_steps - skip)
        ds = ds.map(lambda x, y: ({k: x[k] for k in self.input_keys}, y))
        if not self.distributed:
            return ds.prefetch(tf.data.AUTOTUNE)
        per_replica = self.config.schedule.batch_size // self.strategy.num_replicas_in_sync

        def dataset_fn(context):
            if context.num_input_pipelines != self.workers:
                raise ValueError(f"{context.num_input_pipelines} input pipelines for {self.workers} workers")
            return ds.rebatch(per_replica)

        return self.strategy.distribute_datasets_from_function(dataset_fn)
