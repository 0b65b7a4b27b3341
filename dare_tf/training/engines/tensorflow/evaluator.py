"""A seed's evaluator: predictions over whole splits, BatchNorm's refresh and the
cascade's metrics, gathered from every worker."""

from __future__ import annotations

import numpy as np

from dare_tf._faces import public
from dare_tf.training.engines.tensorflow.input import TensorFlowInput
from dare_tf.training.engines.tensorflow.prediction import (predict_batches, predict_split,
                                                            refresh_batch_norm_statistics)
from dare_tf.training.evaluation import evaluation_batch
from dare_tf.training.reranking import Cascade


@public("dare_tf.training")
class Evaluator:
    """Evaluates `model` on the splits of `plan`'s dataset (this worker's
    partitions; with several workers, every worker's outputs in worker order)."""

    def __init__(self, model, plan: TensorFlowInput, cascade: Cascade | None = None):
        self.model, self.plan, self.cascade = model, plan, cascade
        self.config = plan.config

    def _combine(self):
        from dare_tf.training.engines.tensorflow.distribution import gather_workers

        return (lambda arrays: gather_workers(self.plan.strategy, arrays)) if self.plan.workers > 1 else None

    @property
    def batch_size(self) -> int:
        """The evaluation batch of streamed splits (`evaluation_batch`)."""
        return evaluation_batch(self.config, self.plan.max_len)

    @property
    def memory_batch_size(self) -> int:
        """The batch of the splits evaluated from memory (`evaluation_batch`)."""
        counts = [len(self.plan.memory[s]) for s in ("val", "test") if s in self.plan.memory]
        return evaluation_batch(self.config, self.plan.max_len, counts)

    def predict(self, split: str) -> dict[str, np.ndarray]:
        """Predictions over the whole split: this worker's partitions, gathered
        from every worker (in worker order) when there are several."""
        plan, reference = self.plan, self.config.reference_mode
        if split in plan.memory:
            # Every batch full-sized (the last one padded with example 0, its outputs
            # dropped): one compiled shape for all evaluations.
            size, count = self.memory_batch_size, len(plan.memory[split])
            count = count // size * size if reference else count
            order = np.zeros(-(-count // size) * size, np.int64)
            order[:count] = np.arange(count)
            outputs = predict_batches(self.model, plan.memory[split].batches(order, size), reference,
                                      f"{plan.data_dir}: the {split} split")
            outputs = {k: v[:count] for k, v in outputs.items()}
        else:
            outputs = predict_split(self.model, plan.data_dir, split, self.batch_size, plan.spec,
                                    drop_remainder=reference, training=reference, partitions=plan.partitions)
        return self._combine()(outputs) if plan.workers > 1 else outputs

    def refresh_batch_norm_statistics(self) -> None:
        """BatchNorm's moving statistics from the plan's `bn_statistics_batches` training batches
        (`dare_tf.training.engines.tensorflow.prediction.refresh_batch_norm_statistics`); nothing in
        reference mode."""
        cfg, count = self.config, self.plan.bn_statistics_batches
        if cfg.reference_mode or not count:
            return
        # A small shuffle buffer: a mixed sample of the training split, cheap to fill.
        batches = self.plan.epoch_batches(999, min(cfg.data.shuffle_buffer, 8 * cfg.schedule.batch_size))
        refresh_batch_norm_statistics(
            self.model, (x for x, _ in batches.take(count)), self._combine())

    def cascade_metrics(self, split: str, retrieval: bool = True) -> dict[str, float]:
        """The cascade's metrics of `split` (`dare_tf.training.reranking`), of every
        worker's positives; {} without a retrieval run."""
        if self.cascade is None or split not in self.cascade.examples:
            return {}
        return self.cascade.examples[split].metrics(self.model, retrieval, self._combine())
