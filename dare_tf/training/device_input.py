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
from dare_tf.data.storage.schema import EXAMPLE_TIME, HIST_TIME_GAP, TARGET_CATEGORY, TARGET_ITEM, USER, target_feature

INT32_MAX = np.iinfo(np.int32).max


def _relative_times(split: InMemorySplit) -> tuple[int, np.ndarray | None]:
    """The store's first click time and its times as int32 offsets from it."""
    times = split.store.times
    if times is None:
        return 0, None
    base = int(times.min()) if len(times) else 0
    span = (int(times.max()) - base) if len(times) else 0
    example = split.columns.get(EXAMPLE_TIME)
    if example is not None and len(example):
        span = max(span, int(example.max()) - base, base - int(example.min()))
    if span >= INT32_MAX:
        raise ValueError(f"the dataset's click times span {span} s, more than the {INT32_MAX} s (68 years) the "
                         "trainer on JAX holds as int32 offsets; train on TensorFlow, or prepare without --time_gap")
    return base, (times - base).astype(np.int32)


@public("dare_tf.training")
class DeviceSplit:
    """A split's example columns and its store on the devices, and its batches
    assembled there: `assemble(arrays, rows)` (traceable) gives the model's
    features and the float32 labels of the examples `rows` (`[B]` indices).

    `put(host_array)` places an array (default: on the first device; the
    trainer's `jax_distribution.Placement.replicate` copies it to every device
    of its mesh)."""

    def __init__(self, split: InMemorySplit, put=jax.device_put):
        store = split.store
        self.max_len, self.targets, self.count = split.max_len, tuple(store.targets), len(split)
        self.names, clicks = store.click_rows()
        self.padding = len(clicks) - 1
        base, times = _relative_times(split)
        columns = {k: v for k, v in split.columns.items() if k != EXAMPLE_TIME}
        if len(clicks) >= INT32_MAX:
            raise ValueError(f"the store holds {len(clicks) - 1} clicks, more than int32 indices reach on JAX")
        host = {"clicks": clicks, "start": store.start.astype(np.int32),
                **{f"column/{k}": np.asarray(v, np.int32) for k, v in columns.items()}}
        if times is not None:
            host["times"] = np.append(times, 0).astype(np.int32)
            host["edges"] = np.minimum(store.edges, INT32_MAX).astype(np.int32)
            host[f"column/{EXAMPLE_TIME}"] = (split.columns[EXAMPLE_TIME] - base).astype(np.int32)
        self.time_gap = times is not None
        self.arrays = {k: put(v) for k, v in host.items()}

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
            buckets = jnp.maximum(jnp.searchsorted(arrays["edges"], gaps, side="right"), 1)
            features[HIST_TIME_GAP] = jnp.where(valid, buckets, 0).astype(jnp.int32)
        return features, c["label"].astype(jnp.float32)


__all__ = ["DeviceSplit"]
