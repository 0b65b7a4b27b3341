"""A split's example columns streamed from its shards with no TensorFlow (the
package's own reader, `dare_tf.data.storage.records.read_shard`): what the
trainer on JAX reads where a split is larger than `--in_memory_mb`.

Host memory stays bounded whatever the split's size: at most `CYCLE` shards
decoded at once and one shuffle window. Two orders:

- file order (`in_order`), as `dare_tf.data.feeding.pipeline.stream` reads an
  evaluation split;
- a training order fixed by `(seed, epoch)` (`shuffled`), shuffled as the
  tf.data stream shuffles (`pipeline.shuffled_columns`), in numpy: the files'
  order permuted, `CYCLE` files read at once block by block (`STREAM_BLOCK`
  records), the examples of every window of `shuffle_buffer` of them permuted.
  Each epoch is every record once; the same `(seed, epoch)` gives the same
  order in any process, so a run resumed at a step reads what it would have.

`take(chunks, sizes)` re-cuts a stream of column chunks into pieces of the
given sizes (a step's, or a call's several steps' examples).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.records import read_shard
from dare_tf.data.storage.shards import DEFAULT_SHUFFLE_BUFFER, STREAM_BLOCK
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.store import SequenceStore, check_positions

CYCLE = 8  # shards read at once in a training order (tf.data's interleave in pipeline.shuffled_columns)

Columns = dict[str, np.ndarray]


def _concat(parts: list[Columns]) -> Columns:
    return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@public("dare_tf.data")
class ShardStream:
    """The example columns of a split (of `partitions`, default all) read shard by
    shard; with `store`, each shard is checked against it (every example's
    position within its user's stored sequence) as it is read."""

    def __init__(self, data_dir: str, split: str, spec: DatasetSpec, store: SequenceStore | None = None,
                 partitions=None, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER):
        if split not in spec.shards:
            raise KeyError(f"{data_dir}/spec.json: no split {split!r}; splits: {sorted(spec.shards)}")
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
        self.data_dir, self.split, self.spec, self.store = data_dir, split, spec, store
        self.names = spec.shard_files(split, partitions)
        self.count = sum(spec.records(n) for n in self.names)
        self.shuffle_buffer = int(shuffle_buffer)

    def __len__(self) -> int:
        return self.count

    def read(self, name: str) -> Columns:
        """One shard's columns, checked."""
        columns = read_shard(self.data_dir, name, self.spec, self.split)
        if self.store is not None:
            check_positions(columns, self.store, f"{self.data_dir}/{name}: ")
        return columns

    def in_order(self) -> Iterator[Columns]:
        """Each shard's columns, in file order."""
        for name in self.names:
            columns = self.read(name)
            if len(columns["uid"]):
                yield columns

    def shuffled(self, seed: int, epoch: int) -> Iterator[Columns]:
        """Epoch `epoch`'s examples in training order, a window (at most
        `shuffle_buffer` examples) at a time."""
        rng = np.random.default_rng([seed, epoch])
        waiting = [self.names[i] for i in rng.permutation(len(self.names))]
        open_: list[list] = []  # [columns, next row] of the shards being read
        window: list[Columns] = []
        held = 0
        while waiting or open_:
            while waiting and len(open_) < CYCLE:
                open_.append([self.read(waiting.pop(0)), 0])
            for shard in open_:  # one block of each open shard in turn
                columns, at = shard
                block = {k: v[at: at + STREAM_BLOCK] for k, v in columns.items()}
                shard[1] = at + STREAM_BLOCK
                while len(block["uid"]):
                    room = self.shuffle_buffer - held
                    window.append({k: v[:room] for k, v in block.items()})
                    held += len(window[-1]["uid"])
                    block = {k: v[room:] for k, v in block.items()}
                    if held == self.shuffle_buffer:
                        yield self._permuted(window, rng)
                        window, held = [], 0
            open_ = [shard for shard in open_ if shard[1] < len(shard[0]["uid"])]
        if held:
            yield self._permuted(window, rng)

    def epochs(self, seed: int, epochs: int, per_epoch: int, skip: int = 0) -> Iterator[Columns]:
        """The examples of epochs 0 to `epochs - 1` back to back, each epoch its
        first `per_epoch` examples in training order (a run's full batches), from
        example `skip` of that sequence on (a resumed run's)."""
        for epoch in range(skip // per_epoch, epochs):
            at, lo = 0, max(skip - epoch * per_epoch, 0)
            for columns in self.shuffled(seed, epoch):
                n = len(columns["uid"])
                if at + n > lo:
                    yield {k: v[max(lo - at, 0): per_epoch - at] for k, v in columns.items()}
                at += n
                if at >= per_epoch:
                    break

    @staticmethod
    def _permuted(window: list[Columns], rng: np.random.Generator) -> Columns:
        columns = _concat(window)
        order = rng.permutation(len(columns["uid"]))
        return {k: v[order] for k, v in columns.items()}


def take(chunks: Iterable[Columns], sizes: Iterable[int]) -> Iterator[Columns]:
    """The examples of `chunks` (column dicts, in order) cut into pieces of
    `sizes` examples each, in order; a piece the chunks run out before is shorter
    (and the last)."""
    chunks = iter(chunks)
    rest: Columns | None = None
    for size in sizes:
        parts, have = [], 0
        while have < size:
            if rest is None:
                rest = next(chunks, None)
                if rest is None:
                    break
            part = {k: v[: size - have] for k, v in rest.items()}
            parts.append(part)
            have += len(part["uid"])
            rest = {k: v[len(part["uid"]):] for k, v in rest.items()}
            if not len(rest["uid"]):
                rest = None
        if not parts:
            return
        yield _concat(parts)
        if have < size:
            return


__all__ = ["CYCLE", "ShardStream", "take"]
