"""The Beam pipeline's last steps (`dare_tf.data.preparation.beam`): each user's
rows as dense ids, their examples (per protocol chunk, or per user's days with
`--split=time`) and store records, and every shard written by one worker.

What moves between the steps are files of the work directory
(`beam_exchange`): the runner groups their names only.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.logs.times import DAY
from dare_tf.data.preparation.beam_exchange import (get, get_bucket, get_rows, group_starts, lengths, put, put_rows,
                                                    shared)
from dare_tf.data.preparation.beam_statistics import dense_of
from dare_tf.data.preparation.days import example_names, table_columns, user_examples
from dare_tf.data.preparation.examples import USERS_PER_CHUNK, UserRows, chunk_examples, store_rows
from dare_tf.data.preparation.prepared import PartitionedWriter
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.storage.shards import SEGMENT_KIND, STORE_KIND, partition_of
from dare_tf.data.storage.spec import SPLITS


def dense_rows(rows: dict, side: dict) -> dict:
    """A sorted bucket's rows (raw ids) as the statistics' dense ids: `item`,
    `category`, `fields` `[rows, F]`, and `time`, `label` as they are."""
    fields = np.stack([dense_of(side["fields"][j], rows["fields"][:, j]) for j in range(rows["fields"].shape[1])]
                      or [np.zeros(len(rows["item"]), np.int64)], 1)[:, :rows["fields"].shape[1]]
    return {"item": dense_of(side["items"], rows["item"]), "category": dense_of(side["categories"], rows["category"]),
            "time": rows["time"], "label": rows["label"], "fields": fields}


def user_rows(dense: dict, at: slice, side: dict, dtype, times: bool, impressions: bool) -> UserRows:
    """One user's `UserRows` (`at`: its rows of `dense_rows`): `times` kept where
    asked for, `labels` in an impression log, and with `--action_field` which
    rows are clicks (the labels `beam_exchange.block_rows` set)."""
    labels = dense["label"][at]
    return UserRows(items=dense["item"][at].astype(dtype), categories=dense["category"][at].astype(dtype),
                    times=dense["time"][at] if times else None, labels=labels if impressions else None,
                    fields={n: dense["fields"][at, j].astype(dtype) for j, n in enumerate(side["field_names"])},
                    clicked=labels == 1 if ACTION_FIELD in side["field_names"] else None)


def _spans(starts: np.ndarray, total: int):
    return [slice(lo, lo + n) for lo, n in zip(starts.tolist(), lengths(starts, total).tolist())]


def write_shard(element, directory: str, protocol: Protocol, compression: str):
    """Writes one shard from its parts' rows (user split), in part order; returns its spec.json entries."""
    (kind, k), parts = element
    writer = PartitionedWriter(directory, kind, protocol.partitions, compression, indices=[k])
    for _, path in sorted(p for p in parts if p is not None):
        for rows in get(path):
            if kind == STORE_KIND:
                writer.write_store(*rows)
            else:
                writer.write_examples(rows)
    return writer.close()


class UserSplit:
    """The per-user protocol: the qualifying users regrouped by the protocol's
    chunks (`regroup`: each bucket's users into chunk groups, files), each
    group's examples and negatives drawn by `chunk_examples` per chunk
    (`group_outputs`), and each shard written from every group's part."""

    def __init__(self, protocol: Protocol, impressions: bool, work: str, buckets: int):
        self.protocol, self.impressions, self.work, self.buckets = protocol, impressions, work, buckets

    def regroup(self, element, stats_path: str):
        """`(chunk group, file)` of one sorted bucket's qualifying users (dense rows
        with each user's index among the qualifying), per group."""
        j, path, _ = element
        side = shared(stats_path)
        rows, starts = get_bucket(path)
        qualifying = side["stats"].qualifying
        uid = dense_of(side["users"], rows["user"][starts])
        index = np.minimum(np.searchsorted(qualifying, uid), max(len(qualifying) - 1, 0))
        keep = (qualifying[index] == uid) if len(qualifying) else np.zeros(len(uid), bool)
        chunks = -(-len(qualifying) // USERS_PER_CHUNK)
        per_group = USERS_PER_CHUNK * max(1, -(-chunks // self.buckets))
        row_index = np.repeat(np.where(keep, index, -1), lengths(starts, len(rows["user"])))
        taken = np.flatnonzero(row_index >= 0)
        dense = dense_rows({k: v[taken] for k, v in rows.items()}, side)
        dense["index"] = row_index[taken]
        group = dense["index"] // per_group
        for g in np.unique(group).tolist():
            mine = group == g
            yield g, put_rows(os.path.join(self.work, f"users-{g}-of-bucket-{j}"),
                              {k: v[mine] for k, v in dense.items()})

    def group_outputs(self, element, stats_path: str):
        """`((kind, partition), (group, file))` of one chunk group's examples and store records."""
        g, paths = element
        side = shared(stats_path)
        parts = [get_rows(p) for p in sorted(paths)]
        dense = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(dense["index"], kind="stable")  # (a user's rows all come from one bucket)
        dense = {k: v[order] for k, v in dense.items()}
        firsts = group_starts(dense["index"])
        spans, users = _spans(firsts, len(order)), side["stats"].qualifying[dense["index"][firsts]]
        out = defaultdict(list)
        chunk_of = dense["index"][firsts] // USERS_PER_CHUNK
        for chunk in np.unique(chunk_of).tolist():
            members = np.flatnonzero(chunk_of == chunk)
            rows = [user_rows(dense, spans[m], side, np.int32, True, self.impressions) for m in members]
            for split, columns in chunk_examples(chunk, users[members], rows, side["stats"], self.protocol).items():
                parts_of = partition_of(columns["uid"], self.protocol.partitions)
                for k in np.unique(parts_of).tolist():
                    out[(split, k)].append({c: v[parts_of == k] for c, v in columns.items()})
            stored = [r.stored() for r in rows]
            parts_of = partition_of(users[members], self.protocol.partitions)
            for k in np.unique(parts_of).tolist():
                sel = np.flatnonzero(parts_of == k)
                out[(STORE_KIND, k)].append(store_rows(users[members][sel], [stored[i] for i in sel]))
        for (kind, k), rows in out.items():
            yield (kind, k), (g, put(os.path.join(self.work, f"{kind}-{k}-of-group-{g}"), rows))

    def shards(self, pipeline, sequences, stats_path, directory: str, compression: str):
        """Adds the steps; returns the shard list."""
        import apache_beam as beam

        outputs = (sequences
                   | "ToChunkGroups" >> beam.FlatMap(self.regroup, stats_path)
                   | "GroupChunks" >> beam.GroupByKey()
                   | "Chunks" >> beam.FlatMap(self.group_outputs, stats_path))
        # Every shard exists, also a partition's that holds no user.
        empty = pipeline | "AllShards" >> beam.Create(
            [((kind, k), None) for kind in (*SPLITS, STORE_KIND) for k in range(self.protocol.partitions)])
        return ((outputs, empty) | "WithEmpty" >> beam.Flatten()
                | "GroupShards" >> beam.GroupByKey()
                | "WriteShards" >> beam.Map(write_shard, directory, self.protocol, compression)
                | "ShardList" >> beam.combiners.ToList())


class TimeSplit:
    """`--split=time` (`dare_tf.data.preparation.days`): each user's examples over
    its days, its negatives drawn by the clicks up to its day (`ClicksToDate`
    of every day, a file), and every user's store record; each shard holds its
    users in dense id order."""

    def __init__(self, protocol: Protocol, impressions: bool, work: str, fields=()):
        self.protocol, self.impressions, self.work = protocol, impressions, work
        self.names = example_names(fields, protocol.time_gap)

    def user_outputs(self, element, stats_path: str, to_date_path: str, last: int):
        """`((kind, tag, partition), file)` of one sorted bucket's users' examples and store records."""
        j, path, _ = element
        side, to_date = shared(stats_path), shared(to_date_path)
        rows, starts = get_bucket(path)
        dense = dense_rows(rows, side)
        out = defaultdict(list)
        for span, uid in zip(_spans(starts, len(rows["user"])), dense_of(side["users"], rows["user"][starts]).tolist()):
            user = user_rows(dense, span, side, np.int64, True, self.impressions)
            k = int(partition_of(uid, self.protocol.partitions))
            for tag, table in user_examples(uid, user, to_date, self.protocol, self.protocol.bounds(last)):
                out[(SEGMENT_KIND, tag, k)].append((uid, table))
            out[(STORE_KIND, None, k)].append((uid, user.stored()))
        for (kind, tag, k), entries in out.items():
            yield (kind, tag, k), put(os.path.join(self.work, f"{kind}-{tag}-{k}-of-bucket-{j}"), entries)

    def write(self, element, directory: str, compression: str, last: int):
        (kind, tag, k), paths = element
        rows = sorted((e for p in paths if p is not None for e in get(p)), key=lambda e: e[0])
        writer = PartitionedWriter(directory, kind, self.protocol.partitions, compression, indices=[k],
                                   tag=int(last) // DAY * DAY if tag is None else tag)
        if kind == STORE_KIND:
            writer.write_store(*store_rows([u for u, _ in rows], [s for _, s in rows]))
        else:
            table = np.concatenate([t for _, t in rows] or [np.zeros((0, len(self.names)), np.int64)])
            writer.write_examples(table_columns(table, self.names))
        return writer.close()

    def shards(self, pipeline, sequences, stats_path, to_date_path, last_time, directory: str, compression: str):
        """Adds the steps; returns the shard list."""
        import apache_beam as beam

        outputs = sequences | "Users" >> beam.FlatMap(self.user_outputs, stats_path, to_date_path, last_time)
        tags = (outputs | "Tags" >> beam.Map(lambda o: o[0][1]) | "DistinctTags" >> beam.Distinct())
        empty = (tags | "EveryPartition" >> beam.FlatMap(lambda t: [
            ((STORE_KIND if t is None else SEGMENT_KIND, t, k), None) for k in range(self.protocol.partitions)]))
        return ((outputs, empty) | "WithEmptyShards" >> beam.Flatten()
                | "GroupShards" >> beam.GroupByKey()
                | "WriteShards" >> beam.Map(self.write, directory, compression, last_time)
                | "ShardList" >> beam.combiners.ToList())
