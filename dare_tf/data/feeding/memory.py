"""A split's examples held in memory (`InMemorySplit`), with no TensorFlow: its
batches assembled on the host in numpy (`host_batches`), by tf.data
(`dare_tf.data.feeding.pipeline.memory_batches`), or on an accelerator
(`dare_tf.training.engines.jax.device_input`)."""

from __future__ import annotations

import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.schema import EXAMPLE_TIME, TARGET_CATEGORY, TARGET_ITEM, USER, target_feature
from dare_tf.data.storage.store import SequenceStore, check_max_len, load_store, read_examples


@public("dare_tf.data")
class InMemorySplit:
    """A split's examples (of all partitions, or a worker's) held in memory, and the store they point into.

    `batches(order, batch_size)` yields `(features, label)` batches of the
    examples `order` (indices): a shuffled epoch is a permutation of
    `range(N)` (a uniform shuffle, no buffer to fill) and skipping to a step
    costs nothing. Features are int32 `uid`, `target_item`, `target_category`
    `[B]` and `hist_items`, `hist_categories` `[B, max_len]`; the label is
    float32 `[B]`. `features` holds every example's features as numpy arrays
    (materialised on first use: `N x max_len` per history feature, for
    analyses at moderate L).

    `drawn_epochs`: the columns hold that many epochs' examples back to back,
    each already in its training order (`dare_tf.data.feeding.negatives` draws them);
    0: one set of examples, each epoch a permutation of it.
    """

    def __init__(self, columns: dict[str, np.ndarray], store: SequenceStore, max_len: int, drawn_epochs: int = 0):
        check_max_len(max_len)
        self.columns, self.store, self.max_len = columns, store, int(max_len)
        self.labels = columns["label"].astype(np.float32)
        self.drawn_epochs = int(drawn_epochs)
        self._features = None
        self._tensors = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def per_epoch(self) -> int:
        """Examples of one epoch."""
        return len(self) // max(self.drawn_epochs, 1)

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The indices of epoch `epoch`'s examples in training order: a permutation
        fixed by `(seed, epoch)`; with drawn epochs, that epoch's rows as drawn
        (past the last drawn epoch, a permutation of the rows of `epoch` modulo them)."""
        rng = np.random.default_rng([seed, epoch])
        if not self.drawn_epochs:
            return rng.permutation(len(self))
        first = (epoch % self.drawn_epochs) * self.per_epoch
        rows = np.arange(first, first + self.per_epoch)
        return rows if epoch < self.drawn_epochs else rng.permutation(rows)

    @staticmethod
    def estimated_bytes(spec: DatasetSpec, split: str, partitions=None) -> int:
        """Memory of the split's columns (the store is shared by all splits)."""
        columns = len(spec.record_columns[0]) + (EXAMPLE_TIME in spec.record_columns[0])  # (times: 8 bytes)
        return sum(spec.records(n) for n in spec.shard_files(split, partitions)) * 4 * columns

    @classmethod
    def load(cls, data_dir: str, split: str, spec: DatasetSpec | None = None,
             max_len: int | None = None, partitions=None) -> "InMemorySplit":
        spec = spec or DatasetSpec.load(data_dir)
        store = load_store(data_dir, spec, partitions)
        columns = read_examples(data_dir, split, spec, store, partitions)
        if not len(columns["uid"]):
            raise ValueError(f"{data_dir}: the {split} split has no examples"
                             + ("" if partitions is None else f" in partitions {list(partitions)}"))
        return cls(columns, store, spec.max_len if max_len is None else max_len)

    @property
    def features(self) -> dict[str, np.ndarray]:
        if self._features is None:
            self._features = self.features_of(self.columns)
        return self._features

    def features_of(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's inputs of the examples `columns` (a subset of `columns`' rows)."""
        c = columns
        return {USER: c["uid"], TARGET_ITEM: c["target_item"], TARGET_CATEGORY: c["target_category"],
                **{target_feature(n): c[target_feature(n)] for n in self.store.targets},
                **self.store.histories(c, self.max_len)}

    def batches(self, order: np.ndarray, batch_size: int):
        """`(features, label)` batches of the examples `order` (indices), in that
        order, as a `tf.data.Dataset` (`dare_tf.data.feeding.pipeline.memory_batches`);
        when `len(order)` is a multiple of `batch_size`, the batch dimension is static.
        Without TensorFlow: `host_batches`."""
        from dare_tf.data.feeding.pipeline import memory_batches

        return memory_batches(self, order, batch_size)

    def host_batches(self, order: np.ndarray, batch_size: int):
        """The same batches as `batches`, as numpy arrays assembled on the host
        (`SequenceStore.histories`), with no TensorFlow."""
        order = np.asarray(order, np.int64)
        for first in range(0, len(order), batch_size):
            rows = order[first: first + batch_size]
            features = self.features_of({k: v[rows] for k, v in self.columns.items()})
            yield {k: np.asarray(v, np.int32) for k, v in features.items()}, self.labels[rows]


__all__ = ["InMemorySplit"]
