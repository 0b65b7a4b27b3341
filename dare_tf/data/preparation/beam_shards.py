"""The Beam pipeline's last steps (`dare_tf.data.preparation.beam`): each qualifying
user's rows as dense ids, their examples (per protocol chunk, or per user's days
with `--split=time`) and store records, and every shard written by one worker."""

from __future__ import annotations


import numpy as np

from dare_tf.data.preparation.prepared import (PartitionedWriter)
from dare_tf.data.preparation.catalogue import clicks_by_day, day_item_summaries, merge_day_items
from dare_tf.data.preparation.days import example_names, table_columns, user_examples
from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.preparation.examples import USERS_PER_CHUNK, UserRows, chunk_examples, store_rows
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.storage.spec import SPLITS
from dare_tf.data.storage.shards import SEGMENT_KIND, STORE_KIND, partition_of
from dare_tf.data.logs.times import DAY


def _chunk_outputs(element, side: dict, protocol: Protocol, impressions: bool):
    """Examples and store rows of one chunk, keyed by the shard (kind, partition) they belong to."""
    chunk, members = element
    members = sorted(members, key=lambda m: m[0])  # (qualifying index, dense uid, UserRows)
    users = np.array([m[1] for m in members], np.int64)
    rows = [m[2] for m in members]
    for split, columns in chunk_examples(chunk, users, rows, side["stats"], protocol).items():
        parts = partition_of(columns["uid"], protocol.partitions)
        for k in np.unique(parts).tolist():
            yield (split, k), (chunk, {c: v[parts == k] for c, v in columns.items()})
    stored = [r.stored(protocol.time_gap) for r in rows]
    parts = partition_of(users, protocol.partitions)
    for k in np.unique(parts).tolist():
        sel = np.flatnonzero(parts == k)
        yield (STORE_KIND, k), (chunk, store_rows(users[sel], [stored[i] for i in sel]))


def _write_shard(element, directory: str, protocol: Protocol, compression: str):
    """Writes one shard from its chunks' rows, in chunk order; returns its spec.json entries."""
    (kind, k), parts = element
    writer = PartitionedWriter(directory, kind, protocol.partitions, compression, indices=[k])
    for _, rows in sorted((p for p in parts if p is not None), key=lambda p: p[0]):
        if kind == STORE_KIND:
            writer.write_store(*rows)
        else:
            writer.write_examples(rows)
    return writer.close()


def _rows(side: dict, seq, dtype, times: bool, impressions: bool) -> UserRows:
    """A user's sequence (`_user_sequence`) as dense ids (the statistics' maps):
    `times` kept where asked for, `labels` in an impression log, and with
    `--action_field` which rows are clicks (the labels `_block_users` set)."""
    _, _, items, categories, _, row_times, labels, fields = seq
    return UserRows(items=np.array([side["item_dense"][int(i)] for i in items], dtype),
                    categories=np.array([side["category_dense"][int(c)] for c in categories], dtype),
                    times=np.asarray(row_times, np.int64) if times else None, labels=labels if impressions else None,
                    fields={n: np.array([side["field_dense"][j][int(v)] for v in fields[:, j]], dtype)
                            for j, n in enumerate(side["field_names"])},
                    clicked=labels == 1 if ACTION_FIELD in side["field_names"] else None)


def user_split_shards(pipeline, sequences, side, protocol: Protocol, directory: str, compression: str,
                       impressions: bool):
    """The per-user protocol: the qualifying users grouped into the protocol's
    chunks, whose examples and negatives `chunk_examples` draws; returns the
    shard list."""
    import apache_beam as beam

    def to_chunks(seq, side_):
        uid = side_["user_dense"][seq[0]]
        index = side_["index"].get(uid)
        if index is None:
            return
        yield index // USERS_PER_CHUNK, (index, uid, _rows(side_, seq, np.int32, impressions or protocol.time_gap,
                                                           impressions))

    outputs = (sequences
               | "ToChunks" >> beam.FlatMap(to_chunks, side)
               | "GroupChunks" >> beam.GroupByKey()
               | "Chunks" >> beam.FlatMap(_chunk_outputs, side, protocol, impressions))
    # Every shard exists, also a partition's that holds no user.
    empty = pipeline | "AllShards" >> beam.Create(
        [((kind, k), None) for kind in (*SPLITS, STORE_KIND) for k in range(protocol.partitions)])
    return ((outputs, empty) | "WithEmpty" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.Map(_write_shard, directory, protocol, compression)
            | "ShardList" >> beam.combiners.ToList())


def time_split_shards(pipeline, sequences, side, last_time, protocol: Protocol, directory: str, compression: str,
                       impressions: bool, fields=()):
    """`--split=time` (`dare_tf.data.preparation.days`): each user's examples over its days,
    its negatives drawn by the clicks up to its day (a side input of every
    day's `ClicksToDate`: a vocabulary's counts per day, which bounds the
    days and items this driver takes), and every user's store record; returns
    the shard list."""
    import apache_beam as beam

    names = example_names(fields, protocol.time_gap)
    summaries = (sequences
                 | "DaySummaries" >> beam.FlatMap(lambda s: day_item_summaries(s[2], s[3], s[5], s[4], s[6], s[7]))
                 | "MergeDays" >> beam.CombinePerKey(merge_day_items)
                 | "AllDays" >> beam.combiners.ToList())
    to_date = beam.pvalue.AsSingleton(summaries | "ClicksByDay" >> beam.Map(clicks_by_day, side))

    def user_outputs(seq, side_, clicks, last):
        uid = side_["user_dense"][seq[0]]
        rows = _rows(side_, seq, np.int64, True, impressions)
        k = int(partition_of(uid, protocol.partitions))
        for tag, table in user_examples(uid, rows, clicks, protocol, protocol.bounds(last)):
            yield (SEGMENT_KIND, tag, k), (uid, table)
        yield (STORE_KIND, None, k), (uid, rows.stored(protocol.time_gap))

    outputs = sequences | "Users" >> beam.FlatMap(user_outputs, side, to_date, last_time)
    tags = (outputs | "Tags" >> beam.Map(lambda o: o[0][1]) | "DistinctTags" >> beam.Distinct())
    empty = (tags | "EveryPartition" >> beam.FlatMap(lambda t: [
        ((STORE_KIND if t is None else SEGMENT_KIND, t, k), None) for k in range(protocol.partitions)]))

    def write(element, last):
        (kind, tag, k), parts = element
        rows = sorted((p for p in parts if p is not None), key=lambda p: p[0])
        writer = PartitionedWriter(directory, kind, protocol.partitions, compression, indices=[k],
                                   tag=int(last) // DAY * DAY if tag is None else tag)
        if kind == STORE_KIND:
            writer.write_store(*store_rows([u for u, _ in rows], [s for _, s in rows]))
        else:
            table = np.concatenate([t for _, t in rows] or [np.zeros((0, len(names)), np.int64)])
            writer.write_examples(table_columns(table, names))
        return writer.close()

    return ((outputs, empty) | "WithEmptyShards" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.Map(write, last_time)
            | "ShardList" >> beam.combiners.ToList())
