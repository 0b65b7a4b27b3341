"""The trainer's input on JAX, with no TensorFlow: a dataset's click store and a
split's example columns held in the accelerators' memory (`DeviceSplit`), and
each batch's history windows a gather inside the jitted step (`assemble`).

The host sends nothing per step but the step's example indices: the store
(`[C + 1, F]` int32, every history feature of each click side by side, a last
row of zeros for padded slots) and the columns (`[N]` int32 each) are put on
the devices once, replicated (`put`), and a batch reads `[B, L, F]` store rows.
The windows are the ones `dare_tf.data.feeding.pipeline.assemble_fn` builds
in tf.data and `SequenceStore.histories` in numpy (tested equal): the last L
clicks of the example's user before its position, left-padded with 0; with
the time gap, each click's gap bucket (`dare_tf.data.storage.fields`).
Times travel as int32 offsets from the store's first time, so a dataset's
clicks must span less than 68 years (2**31 s; refused otherwise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dare_tf._faces import public
from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.storage.fields import time_gap_buckets
from dare_tf.data.storage.store import SequenceStore
from dare_tf.data.storage.schema import EXAMPLE_TIME, HIST_TIME_GAP, TARGET_CATEGORY, TARGET_ITEM, USER, target_feature

INT32_MAX = np.iinfo(np.int32).max


def _relative_times(store: SequenceStore) -> tuple[int, np.ndarray | None]:
    """The store's first click time and its times as int32 offsets from it."""
    times = store.times
    if times is None:
        return 0, None
    base = int(times.min()) if len(times) else 0
    _check_span(int(times.max()) - base if len(times) else 0)
    return base, (times - base).astype(np.int32)


def _check_span(span: int) -> None:
    if span >= INT32_MAX:
        raise ValueError(f"the dataset's click times span {span} s, more than the {INT32_MAX} s (68 years) the "
                         "trainer on JAX holds as int32 offsets; train on TensorFlow, or prepare without --time_gap")


@public("dare_tf.training")
class DeviceSplit:
    """A split's example columns and its store on the devices, and its batches
    assembled there: `assemble(arrays, rows)` (traceable) gives the model's
    features and the float32 labels of the examples `rows` (`[B]` indices).

    `put(host_array)` places an array (default: on the first device; the
    trainer's `distribution.Placement.replicate` copies it to every device
    of its mesh). `split` None: the store only (`count` 0), whose
    `with_columns` gives the splits, or a streamed split's chunks, that share
    its arrays on the devices."""

    def __init__(self, split: InMemorySplit | None, put=jax.device_put, *, store: SequenceStore | None = None,
                 max_len: int | None = None):
        store = split.store if split is not None else store
        self.max_len = split.max_len if split is not None else int(max_len)
        self.targets, self.put = tuple(store.targets), put
        self.names, clicks = store.click_rows()
        self.padding = len(clicks) - 1
        if len(clicks) >= INT32_MAX:
            raise ValueError(f"the store holds {len(clicks) - 1} clicks, more than int32 indices reach on JAX")
        self.base, times = _relative_times(store)
        host = {"clicks": clicks, "start": store.start.astype(np.int32)}
        if times is not None:
            host["times"] = np.append(times, 0).astype(np.int32)
            host["edges"] = np.minimum(store.edges, INT32_MAX).astype(np.int32)
        self.time_gap = times is not None
        self.store_arrays = {k: put(v) for k, v in host.items()}
        self.arrays, self.count = dict(self.store_arrays), 0
        if split is not None:
            self.arrays, self.count = self._columns(split.columns, len(split))

    def _columns(self, columns: dict[str, np.ndarray], size: int) -> tuple[dict, int]:
        count = len(columns["uid"])
        host = {}
        for k, v in columns.items():
            if k == EXAMPLE_TIME:
                if self.time_gap and count:
                    _check_span(max(int(v.max()) - self.base, self.base - int(v.min())))
                    v = v - self.base
                else:
                    continue
            padded = np.zeros(size, np.int32)  # (rows past `count`: example 0's columns never read)
            padded[:count] = v
            host[f"column/{k}"] = padded
        return {**self.store_arrays, **{k: self.put(v) for k, v in host.items()}}, count

    def with_columns(self, columns: dict[str, np.ndarray], size: int | None = None) -> "DeviceSplit":
        """A split of the examples `columns` on this store's arrays, its columns
        padded to `size` rows (so that chunks of a stream share compiled functions)."""
        chunk = object.__new__(DeviceSplit)
        chunk.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("arrays", "count")})
        chunk.arrays, chunk.count = self._columns(columns, len(columns["uid"]) if size is None else size)
        return chunk

    def assemble(self, arrays: dict, rows) -> tuple[dict, object]:
        """The features and labels of the examples `rows`, from `arrays` (this
        split's `arrays`, passed into the jitted function that calls this)."""
        c = {k.split("/", 1)[1]: v[rows] for k, v in arrays.items() if k.startswith("column/")}
        rel = c["position"][:, None] + jnp.arange(-self.max_len, 0, dtype=jnp.int32)[None, :]
        valid = rel >= 0
        index = jnp.where(valid, arrays["start"][c["uid"]][:, None] + rel, self.padding)
        window = arrays["clicks"][index]  # [B, L, F]
        features = {USER: c["uid"], TARGET_ITEM: c["target_item"], TARGET_CATEGORY: c["target_category"],
                    **{name: window[..., j] for j, name in enumerate(self.names)},
                    **{target_feature(n): c[target_feature(n)] for n in self.targets}}
        if self.time_gap:
            gaps = c[EXAMPLE_TIME][:, None] - arrays["times"][index]
            buckets = time_gap_buckets(gaps, arrays["edges"], jnp)
            features[HIST_TIME_GAP] = jnp.where(valid, buckets, 0).astype(jnp.int32)
        return features, c["label"].astype(jnp.float32)


class StreamedInput:
    """A split larger than `--in_memory_mb` on JAX: its examples read from the
    shards (`ShardStream`, host memory a few shards and a shuffle window) in a
    background thread, each call's examples put on the devices on `template`'s
    store (`DeviceSplit.with_columns`) ahead of the call: the next call's
    examples are read and placed while the devices run this one (`AHEAD`)."""

    AHEAD = 2

    def __init__(self, stream, template: DeviceSplit):
        self.stream, self.template = stream, template

    def training(self, seed: int, epochs: int, per_epoch: int, skip: int, calls: list[int], batch: int):
        """`(split, rows)` for each call of `calls` steps (a list), from example
        `skip` of the epochs' sequence (`ShardStream.epochs`): `rows` `[S, batch]`
        indices into `split`, every chunk padded to the largest call's examples."""
        from dare_tf.data.feeding.shard_stream import take

        size = max(calls, default=0) * batch
        pieces = take(self.stream.epochs(seed, epochs, per_epoch, skip), [s * batch for s in calls])
        return _ahead(((self.template.with_columns(piece, size),
                        np.arange(steps * batch, dtype=np.int32).reshape(steps, batch))
                       for piece, steps in zip(pieces, calls)), self.AHEAD)

    def epoch_start(self, seed: int, epoch: int, steps: int, batch: int):
        """`(split, rows)` of the first `steps` batches of epoch `epoch`'s training order."""
        from dare_tf.data.feeding.shard_stream import take

        piece = next(take(self.stream.shuffled(seed, epoch), [steps * batch]))
        return self.template.with_columns(piece), np.arange(steps * batch, dtype=np.int32).reshape(steps, batch)

    def in_order(self, rows: int):
        """The split in file order as chunks of `rows` examples on the devices (the last shorter, padded)."""
        from itertools import repeat

        from dare_tf.data.feeding.shard_stream import take

        return _ahead((self.template.with_columns(piece, rows) for piece in take(self.stream.in_order(), repeat(rows))),
                      self.AHEAD)


def _ahead(items, depth: int):
    """`items` produced by a daemon thread up to `depth` ahead of the consumer; its
    error raised in the consumer."""
    import queue
    import threading

    ready: queue.Queue = queue.Queue(depth)
    done = object()

    def produce():
        try:
            for item in items:
                ready.put(item)
        except BaseException as e:  # noqa: BLE001 (handed to the consumer)
            ready.put(e)
        ready.put(done)

    threading.Thread(target=produce, daemon=True, name="streamed-input").start()
    while (item := ready.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


__all__ = ["DeviceSplit", "StreamedInput"]
