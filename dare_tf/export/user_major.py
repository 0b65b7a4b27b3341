"""The `rank` signature's rows (`dare_tf.signatures`: one history and one candidate
list per user, each row behind its leading width column) -> the model's dense
`rank` inputs, with each row's refusal."""

from __future__ import annotations

import tensorflow as tf

from dare_tf.data.storage.schema import CANDIDATE_ITEMS, HIST_ITEMS, HIST_TIME_GAP, input_role
from dare_tf.export import rows
from dare_tf.signatures import CANDIDATE_COUNT, HIST_LENGTH



def rank_inputs(graph, *values):
    """`rank`'s raw inputs (`rank_ranks`' inputs, in order) -> the model's dense
    `rank` inputs, the history index of each of the model's L slots (`[U, L]`,
    -1 for padding), each candidate's validity `[U, N]` and each row's `error`
    `[U]`. Each 2-D row starts with minus its width (`rows`); only the
    `hist_length` ids and `candidate_count` candidates after that column are
    read (TF Serving's batcher pads what follows them), and at most the
    export's `max_candidates`. A row whose lengths its width cannot hold is
    answered with its error, not read."""
    raw = dict(zip(graph.rank_ranks, values))
    rank_checks = [tf.debugging.assert_rank(raw[name], rank, message=(
        f"input {name} must have shape {'[users]' if rank == 1 else '[users, ' + name.split('_')[0] + 's]'}"))
        for name, rank in graph.rank_ranks.items()]
    histories = [n for n, rank in graph.rank_ranks.items() if rank == 2 and input_role(n) == "hist"]
    candidates = [n for n, rank in graph.rank_ranks.items() if rank == 2 and input_role(n) == "candidate"]
    with tf.control_dependencies(rank_checks):  # (static ranks once they are checked)
        raw = {name: graph.stand_in(name, rows.of_rank(raw[name], rank), rank)
               for name, rank in graph.rank_ranks.items()}
        users = tf.shape(raw[HIST_LENGTH])[0]
        shape_checks = [  # (TF Serving's batcher never merges requests these fail)
            tf.debugging.assert_equal(tf.shape(raw[name])[0], users, message=(
                f"{name}: its first dimension (users) differs from that of {HIST_LENGTH}; every input of a rank "
                "request has one row per user"))
            for name in graph.rank_ranks if name != HIST_LENGTH]
    with tf.control_dependencies(shape_checks):
        raw.update({name: rows.as_wide(raw[name], raw[HIST_ITEMS]) for name in histories[1:]})
        raw.update({name: rows.as_wide(raw[name], raw[CANDIDATE_ITEMS]) for name in candidates[1:]})
        length, count = tf.cast(raw[HIST_LENGTH], tf.int64), tf.cast(raw[CANDIDATE_COUNT], tf.int64)
        width, checks = rows.width_checks(raw, HIST_ITEMS, histories[1:], tf.shape(raw[HIST_ITEMS])[1])
        checks.append(((length < 0) | (length > width - 1), rows.text(
            f"{HIST_LENGTH} ", length, " is outside [0, ", width - 1, "], the ids its history row carries")))
        slots, candidate_checks = rows.width_checks(raw, CANDIDATE_ITEMS, candidates[1:],
                                                    tf.shape(raw[CANDIDATE_ITEMS])[1])
        checks += candidate_checks
        checks.append(((count < 0) | (count > slots - 1), rows.text(
            f"{CANDIDATE_COUNT} ", count, " is outside [0, ", slots - 1, "], the candidates its row carries")))
        checks.append((count > graph.max_candidates, rows.text(
            f"{CANDIDATE_COUNT} ", count, " is over this export's limit of ", str(graph.max_candidates),
            " candidates per user (serving.export --max_candidates)")))
        # The most recent min(length, L) of the row's `length` ids, right-aligned.
        column = length[:, None] - graph.max_len + tf.range(graph.max_len, dtype=tf.int64)[None, :]
        at = tf.minimum(tf.maximum(column, 0) + 1, tf.cast(tf.shape(raw[HIST_ITEMS])[1], tf.int64))
        one_more = [[0, 0], [0, 1]]  # (a row of only its leading column still has a slot to gather from)
        gathered = {name: tf.gather(tf.pad(raw[name], one_more), at, batch_dims=1) for name in histories}
        if HIST_TIME_GAP in raw:
            checks.append(rows.negative_gaps(gathered[HIST_TIME_GAP], column >= 0))
        error = rows.first_error(users, checks)
    ok = error == ""
    real = ok[:, None] & (column >= 0) & (gathered[HIST_ITEMS] > 0)
    # At most max_candidates after the leading column (a merged batch may be wider).
    cut = {name: raw[name][:, 1:1 + graph.max_candidates] for name in candidates}
    valid = ok[:, None] & (tf.range(tf.shape(cut[CANDIDATE_ITEMS])[1], dtype=tf.int64)[None, :] < count[:, None])
    inputs = {**{name: tf.where(real, graph.dense(name, gathered[name]), 0) for name in histories},
              **{name: graph.dense(name, cut[name]) for name in candidates}}
    return inputs, tf.where(real, column, -1), valid, error
