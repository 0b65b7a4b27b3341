"""Row lookups on JAX with a gradient built for the GPU (`take`): the table's
gradient as one scatter-add of the looked-up rows' cotangents, materialized first;
a small table's (a category table) summed into 32 copies, then added.

JAX's own gradient of `jnp.take` is the same scatter-add, but XLA fuses the
cotangent's producers into it (on DARE, a reduction over the 200 history slots was
recomputed inside the item table's scatter: 430 us of a 1.7 ms step on an H200,
benchmarks/bench_gpu.py), and every lookup of a popular row is an atomic add on the
same address: a category table of 2,000 rows takes 400k atomic adds a step, which
32 copies spread. The forward pass is `jnp.take`'s; the gradient is the same sum,
added in another order (equal within float32 rounding,
tests/layers/test_table_gradients.py). `MODES` holds the ways measured against each
other (docs/gpu.md); `DEFAULT_MODE` the one each platform uses.

`take_slots` reads the K slots a search keeps through `take` too, from the
`[B * L, D]` rows of the batch's histories (`dare_tf.layers.pooling.gather_slots`
on JAX, in every mode but `xla`).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

# How a lookup's gradient is built: `xla` (JAX's own), `materialized` (one scatter of
# the materialized cotangents), `sorted` (and the ids sorted where the table has fewer
# rows than the lookups), `sorted_all` (sorted for every table).
MODES = ("xla", "materialized", "sorted", "sorted_all", "privatized")
# `privatized`: materialized, and a table with at most 1/8 as many rows as lookups (a
# category table: its popular rows contended by thousands of atomic adds) summed into
# `COPIES` copies, lookup i into copy i % COPIES, then the copies added.
COPIES = 32
# The default by platform: on an H200 `privatized` ran DARE's steps 1.58x (batch 2048)
# and 1.33x (8192) as fast as `xla`, `sorted` slower than `materialized` (docs/gpu.md);
# on a CPU every mode but `xla` was slower (its atomics cost nothing to contend).
DEFAULT_MODE = {"gpu": "privatized"}
_MODE: list[str] = []


def current_mode() -> str:
    """The mode lookups traced now use: `table_gradient_mode`'s, else the default of
    the platform JAX computes on (`xla` where `DEFAULT_MODE` names none)."""
    return _MODE[-1] if _MODE else DEFAULT_MODE.get(jax.default_backend(), "xla")


@contextlib.contextmanager
def table_gradient_mode(mode: str):
    """While open, lookups traced on JAX build their gradient as `mode` (one of
    `MODES`); the benchmark compares them (benchmarks/bench_gpu.py --gradients)."""
    if mode not in MODES:
        raise ValueError(f"table_gradient_mode: {mode!r} is not one of {MODES}")
    _MODE.append(mode)
    try:
        yield
    finally:
        _MODE.pop()


def take(table, ids):
    """`jnp.take(table, ids, axis=0)` (negative ids wrap, ids past the table read NaN
    rows and get no gradient), its gradient as the module says."""
    mode = current_mode()
    if mode == "xla":
        return jnp.take(table, ids, axis=0)
    return _take(table, ids, mode)


def take_slots(values, positions):
    """`values[b, positions[b, k]]` (`[B, L, ...]`, `[B, K]` -> `[B, K, ...]`) as `take`
    of the `[B * L, ...]` rows: a gradient of `B * K` rows scattered, not
    `take_along_axis`'s scatter into a transposed `[B, ..., L]`."""
    batch, length = values.shape[0], values.shape[1]
    rows = positions.astype(jnp.int32) + (jnp.arange(batch, dtype=jnp.int32) * length)[:, None]
    return take(jnp.reshape(values, (batch * length, *values.shape[2:])), rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _take(table, ids, mode):
    return jnp.take(table, ids, axis=0)


def _take_forward(table, ids, mode):
    # (The table's rows and dtype travel as an empty array's shape and dtype.)
    return jnp.take(table, ids, axis=0), (ids, jnp.zeros((table.shape[0], 0), table.dtype))


def _take_backward(mode, residuals, cotangent):
    ids, like = residuals
    rows = like.shape[0]
    flat = jnp.reshape(ids, (-1,)).astype(jnp.int32)
    flat = jnp.where(flat < 0, flat + rows, flat)
    updates = jnp.reshape(cotangent, (flat.shape[0], *cotangent.shape[ids.ndim:]))
    # Materialized: nothing upstream is recomputed per element inside the scatter.
    updates = jax.lax.optimization_barrier(updates)
    if mode == "privatized" and rows * 8 <= flat.shape[0]:
        valid = (flat >= 0) & (flat < rows)
        spread = jnp.where(valid, jnp.arange(flat.shape[0], dtype=jnp.int32) % COPIES * rows + flat, COPIES * rows)
        copies = jnp.zeros((COPIES * rows, *updates.shape[1:]), like.dtype).at[spread].add(
            updates.astype(like.dtype), mode="drop")
        return jnp.sum(jnp.reshape(copies, (COPIES, rows, *updates.shape[1:])), axis=0), None
    ordered = mode == "sorted_all" or (mode == "sorted" and rows < flat.shape[0])
    if ordered:
        flat, order = jax.lax.sort_key_val(flat, jnp.arange(flat.shape[0], dtype=jnp.int32))
        updates = jnp.take(updates, order, axis=0)
    grad = jnp.zeros((rows, *updates.shape[1:]), like.dtype).at[flat].add(
        updates.astype(like.dtype), indices_are_sorted=ordered, mode="drop")
    return grad, None


_take.defvjp(_take_forward, _take_backward)

__all__ = ["DEFAULT_MODE", "MODES", "current_mode", "table_gradient_mode", "take", "take_slots"]
