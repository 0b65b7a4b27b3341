"""The rows of the exported ranker's requests: their layout in the graph (a
tensor's static rank, a history's real ids right-aligned, parsed Examples
behind the leading column) and their per-row checks: a malformed row is
answered with its own `error` message, never with an assertion that fails
the batch TF Serving merged it into.

The layout they check (`dare_tf.signatures`): every `[rows, T]` input of
`serving_default`, `explain`, `rank` and `rank_explain` starts with a leading
column holding minus its own width (`-T`). TF Serving's batcher pads a shorter
request after its values with the tensor's first value, so after merging each
row still states the width its request sent: the graph reads no slot past it
(the padding is never scored), and a history input narrower than `hist_items`
(or a candidate input narrower than `candidate_items`), a `hist_length` or
`candidate_count` longer than the row that was sent, are seen per row whatever
the row was merged with.
"""

from __future__ import annotations

import tensorflow as tf


def leading_width(x) -> tf.Tensor:
    """`[rows]` int64: the width each row of `x` `[rows, T]` states in its leading
    column (minus its first value; 0 for a `[rows, 0]` input, which states none)."""
    return -tf.pad(tf.cast(x, tf.int64), [[0, 0], [0, 1]])[:, 0]


def text(*parts) -> tf.Tensor:
    """Per-row messages joined from Python strings and `[rows]` tensors."""
    return tf.strings.join([part if isinstance(part, str) or part.dtype == tf.string
                            else tf.strings.as_string(part) for part in parts])


def first_error(rows, checks) -> tf.Tensor:
    """`[rows]` string: each row's first failing check's message, "" where none
    fails. `checks`: `(bad [rows] bool, message [rows] string)` in order."""
    error = tf.fill(tf.reshape(rows, [1]), "")
    for bad, message in reversed(checks):
        error = tf.where(bad, message, error)
    return error


def width_checks(raw: dict, ids: str, companions, merged_width) -> tuple[tf.Tensor, list]:
    """The width `raw[ids]`' rows state, and the checks of it: a stated width in
    [1, the merged width], and each companion input stating the same."""
    width = leading_width(raw[ids])
    checks = [((width < 1) | (width > tf.cast(merged_width, tf.int64)), text(
        f"{ids} must start with a column of minus its width (-T for a [rows, T] input, as serving.client "
        "writes it); this row starts with ", -width))]
    for name in companions:
        other = leading_width(raw[name])
        checks.append((other != width, text(f"{name} is not as wide as {ids} (its leading column states ", other,
                                             ", against ", width, ")")))
    return width, checks


def negative_gaps(gaps, real) -> tuple[tf.Tensor, tf.Tensor]:
    """The check that no real behaviour's `hist_time_gap` is negative (a behaviour
    after the request's time)."""
    bad = tf.reduce_any(real & (gaps < 0), axis=1)
    return bad, text("hist_time_gap holds a negative gap, ", tf.reduce_min(tf.where(real, gaps, 0), axis=1),
                     " (a behaviour after the request's time)")


def as_wide(x, like) -> tf.Tensor:
    """`x` `[rows, T']` cut or padded (with 0) to the width of `like` `[rows, T]`: a
    companion input of another width is read no further than its ids, and its
    rows' leading column then tells the width they were sent with
    (`width_checks`), instead of an assertion failing the merged batch."""
    width, own = tf.shape(like)[1], tf.shape(x)[1]
    return tf.pad(x[:, :width], [[0, 0], [0, tf.maximum(width - own, 0)]])


def of_rank(x, rank: int):
    """`x` with a static rank of 1 or 2, for the ops after its rank check: a reshape
    that cannot fail before the check's own message (`[B]` or `[B, T]` unchanged)."""
    if rank == 1:
        return tf.reshape(x, [-1])
    leading = tf.concat([tf.shape(x), [1]], 0)[0]  # (1 for a scalar)
    return tf.reshape(x, tf.stack([leading, tf.reduce_prod(tf.shape(x)[1:])]))


def right_aligned(x, real, width: int):
    """The `real` entries of each row of `x` `[B, T]`, in order, right-aligned in
    `[B, width]` (the last `width` of them), -1 before them."""
    def reverse(t):
        return tf.reverse(t, axis=[1])

    compacted = tf.ragged.boolean_mask(reverse(x), reverse(real))  # each row's real entries, newest first
    compacted = compacted[:, :width].to_tensor(default_value=-1, shape=tf.stack([tf.shape(x)[0], width]))
    return reverse(compacted)


def left_aligned(sparse: tf.SparseTensor) -> tf.Tensor:
    """Dense [B, T + 1] of variable-length rows, each right-aligned (left-padded with
    0) behind the leading column of minus the width that `serving_default` reads."""
    strings = sparse.dtype == tf.string  # (`--string_ids`: padding "", the leading width as text)
    blank = "" if strings else tf.constant(0, sparse.dtype)
    dense = tf.sparse.to_dense(sparse, default_value=blank)
    lengths = tf.cast(tf.RaggedTensor.from_sparse(sparse).row_lengths(), tf.int32)
    width = tf.shape(dense)[1]
    index = tf.range(width)[None, :] - (width - lengths)[:, None]
    valid = index >= 0
    aligned = tf.where(valid, tf.gather(dense, tf.maximum(index, 0), batch_dims=1), tf.fill(tf.shape(dense), blank))
    leading = -tf.cast(width + 1, tf.int64)
    leading = tf.strings.as_string(leading) if strings else leading
    return tf.concat([tf.fill([tf.shape(dense)[0], 1], leading), aligned], axis=1)
