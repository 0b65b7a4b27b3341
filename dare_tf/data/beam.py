"""The preparation protocol as an Apache Beam pipeline, for logs larger than
one machine: `prepare(...)` writes the same store, examples, id maps and
spec.json as `dare_tf.data.protocol.prepare` (tested record for record),
with the DirectRunner locally or any Beam runner (`pipeline_options`).

Program: `python -m data.prepare --runner=beam [--beam_options=...]`.

The driver reads the file once (its sha256 and its blocks cut at line ends,
`dare_tf.data.log_reader.plan_blocks`); everything else runs on the workers:

1. each block is parsed (`parse_block`) and its clicks are grouped by user;
2. each user's clicks are put in protocol order (file order; Tmall: by time);
3. the global statistics (`LogStatistics`: dense ids in order of first
   appearance, each item's last category, click counts, the qualifying
   users) are combined from per-user summaries into one side input;
4. users are grouped into the protocol's chunks, whose examples and
   negatives `chunk_examples` draws (seeded per chunk, as in memory);
   with `--split=time` each user's days are built on their own instead
   (`dare_tf.data.days`, seeded per user and day), against every day's
   item counts (a side input);
5. each shard (one partition's users, in order) is written by one worker
   (TensorFlow's TFRecord writer: any file system TensorFlow reaches).
Step 3's rankings hold one entry per distinct user, item and category on
one worker (the id maps), not one per click.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import logging

from dare_tf.data.log_reader import parse_block, plan_blocks
from dare_tf.data.logs import LogFormat
from dare_tf.data.prepared import (PartitionedWriter, check_compression, guard_dataset_dir, layout_fields,
                                   log_format, make_spec, write_id_maps, write_item_clicks, write_prepared)
from dare_tf.data.days import DAY, clicks_by_day, day_item_summaries, merge_day_items, user_examples
from dare_tf.data.examples import USERS_PER_CHUNK, LogStatistics, UserRows, chunk_examples, qualifying_users
from dare_tf.data.protocol import Protocol, no_user_qualifies, preparation_id, time_windows
from dare_tf.data.spec import EXAMPLE_COLUMNS, SEGMENT_KIND, SPLITS, STORE_KIND, partition_of

MANIFEST = ".beam-manifest.json"  # written by the pipeline into the staging directory, read and removed


def _block_users(block_index: int, clicks):
    """`(raw user, (file keys, items, categories, times, labels))` of one parsed block."""
    keys = (np.int64(block_index) << 32) + np.arange(len(clicks.user), dtype=np.int64)
    labels = clicks.label if clicks.label is not None else np.ones(len(clicks.user), np.int64)
    order = np.argsort(clicks.user, kind="stable")
    users, starts = np.unique(clicks.user[order], return_index=True)
    for u, rows in zip(users, np.split(order, starts[1:])):
        yield int(u), (keys[rows], clicks.item[rows], clicks.category[rows], clicks.time[rows], labels[rows])


def _user_sequence(element, sort_by_time: bool, chronological: bool = False):
    """A user's rows in protocol order (file order, or stably by time):
    `(raw user, first key, items, categories, file keys, times, labels)`. The
    first key orders the users: the first file key, or `chronological` (a
    `--split=time` log, read in time order) the first (time, file key)."""
    user, parts = element
    keys, items, categories, times, labels = (np.concatenate([p[i] for p in parts]) for i in range(5))
    order = np.lexsort((keys, times)) if sort_by_time or chronological else np.argsort(keys)
    first = (int(times[order[0]]), int(keys[order[0]])) if chronological else int(keys.min())
    return user, first, items[order], categories[order], keys[order], times[order], labels[order]


def _user_summaries(sequence, ranks: dict, sort_by_time: bool, chronological: bool = False):
    """Per distinct item and category of one user: `(first protocol key, last
    protocol key, category at the last, clicks)`. Protocol keys order all
    rows as the in-memory driver sees them: file order (Taobao), user rank
    then position (a time-sorted log), or `chronological` (time, file key)."""
    user, _, items, categories, file_keys, times, labels = sequence
    if chronological:
        keys = list(zip(times.tolist(), file_keys.tolist()))
    elif sort_by_time:
        keys = (np.int64(ranks[user]) << 32) + np.arange(len(items), dtype=np.int64)
    else:
        keys = file_keys
    clicked = labels == 1
    for kind, ids in (("item", items), ("category", categories)):
        uniq, firsts = np.unique(ids, return_index=True)
        last = len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]
        counts = np.bincount(np.searchsorted(uniq, ids[clicked]), minlength=len(uniq))
        for i, f, lst, c in zip(uniq, firsts, last, counts):
            yield (kind, int(i)), (_key(keys[f]), _key(keys[lst]), int(categories[lst]) if kind == "item" else 0,
                                   int(c))


def _key(key):
    return tuple(key) if isinstance(key, tuple) else int(key)


def _merge_summaries(values):
    values = list(values)
    first = min(v[0] for v in values)
    last = max(values, key=lambda v: v[1])
    return first, last[1], last[2], sum(v[3] for v in values)


def _user_ranks(users: dict) -> dict:
    """Raw user -> rank (dense id - 1), in order of first appearance, from
    `{raw user: (first file key, clicks, rows)}`."""
    return {u: r for r, u in enumerate(sorted(users, key=lambda u: users[u][0]))}


def _statistics(users, ranks, summaries, protocol: Protocol, impressions: bool) -> dict:
    """The side input of the chunk stage: `LogStatistics`, the id maps and the
    dense id of every raw id."""
    raw_users = sorted(ranks, key=ranks.get)
    items = sorted(((v[0], k[1], v) for k, v in summaries if k[0] == "item"))
    categories = sorted(((v[0], k[1]) for k, v in summaries if k[0] == "category"))
    item_dense = {raw: i + 1 for i, (_, raw, _) in enumerate(items)}
    category_dense = {raw: i + 1 for i, (_, raw) in enumerate(categories)}
    num_items = len(items) + 2
    item_category = np.zeros(num_items, np.int32)
    counts = np.zeros(num_items, np.int64)
    for _, raw, (_, _, category, count) in items:
        item_category[item_dense[raw]] = category_dense[category]
        counts[item_dense[raw]] = count
    clicks = np.array([0] + [users[u][1] for u in raw_users], np.int64)
    rows = np.array([0] + [users[u][2] for u in raw_users], np.int64)
    # (`--split=time`: users qualify by their clicks alone, on the day they reach min_clicks)
    qualifying = qualifying_users(clicks, rows if impressions and protocol.split == "user" else None, protocol)
    return {"stats": LogStatistics(item_category=item_category, item_cdf=np.cumsum(counts), qualifying=qualifying,
                                   num_users=len(raw_users) + 1),
            "raw_items": [raw for _, raw, _ in items], "raw_categories": [raw for _, raw in categories],
            "raw_users": raw_users, "item_dense": item_dense, "category_dense": category_dense,
            "user_dense": {u: r + 1 for u, r in ranks.items()},
            "index": {int(u): i for i, u in enumerate(qualifying)}, "longest": int(clicks.max())}


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
    stored = [r.clicks() for r in rows]
    parts = partition_of(users, protocol.partitions)
    for k in np.unique(parts).tolist():
        sel = np.flatnonzero(parts == k)
        yield (STORE_KIND, k), (chunk, (users[sel], np.array([len(stored[i][0]) for i in sel]),
                                        np.concatenate([stored[i][0] for i in sel]),
                                        np.concatenate([stored[i][1] for i in sel])))


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


def _write_manifest(files, side: dict, directory: str, source: dict, last_time: int, chronological: bool) -> None:
    if len(side["stats"].qualifying):
        write_id_maps(directory, side["raw_items"], side["raw_categories"], side["raw_users"],
                      side["stats"].item_category)
        if chronological:
            write_item_clicks(directory, np.diff(side["stats"].item_cdf, prepend=0))
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({"files": {name: entry for shard in files for name, entry in shard.items()},
                   "num_items": side["stats"].num_items,
                   "num_categories": len(side["raw_categories"]) + 2, "num_users": side["stats"].num_users,
                   "users": int(len(side["stats"].qualifying)), "longest": side["longest"], "last_time": last_time,
                   **source}, f)


def build_pipeline(pipeline, path: str, fmt: LogFormat, plan, protocol: Protocol, directory: str,
                   skip_bad_lines: bool, compression: str):
    """Adds the preparation to a `beam.Pipeline`."""
    import apache_beam as beam

    impressions, chronological = fmt.impressions, protocol.split == "time"
    blocks = pipeline | "Blocks" >> beam.Create(list(enumerate(plan.blocks)))
    parsed = blocks | "Parse" >> beam.Map(
        lambda b: (b[0], parse_block(path, fmt, plan.names, b[1], skip_bad_lines)))
    counts = (parsed | "BlockCounts" >> beam.Map(lambda p: (p[1].rows, p[1].bad_lines, len(p[1].user) if
                                                             p[1].label is None else int((p[1].label == 1).sum())))
              | "SumCounts" >> beam.CombineGlobally(
                  lambda vs: tuple(int(sum(x)) for x in zip(*vs)) if vs else (0, 0, 0)))
    last_time = beam.pvalue.AsSingleton(
        parsed | "BlockLastTime" >> beam.Map(lambda p: int(p[1].time.max()) if len(p[1].time) else None)
        | "LastTime" >> beam.CombineGlobally(lambda ts: max((t for t in ts if t is not None), default=0)))
    sequences = (parsed
                 | "ByUser" >> beam.FlatMap(lambda p: _block_users(p[0], p[1]))
                 | "GroupUsers" >> beam.GroupByKey()
                 | "Order" >> beam.Map(_user_sequence, sort_by_time=fmt.sort_by_time, chronological=chronological))
    # Raw user -> (first file key, clicks, rows); dense user ids follow the first keys.
    users = (sequences | "UserFirst" >> beam.Map(lambda s: (s[0], (s[1], int((s[6] == 1).sum()), len(s[2]))))
             | "UserMap" >> beam.combiners.ToDict())
    ranks = beam.pvalue.AsSingleton(users | "Ranks" >> beam.Map(_user_ranks))
    merged = (sequences | "Summaries" >> beam.FlatMap(_user_summaries, ranks, fmt.sort_by_time, chronological)
              | "MergeSummaries" >> beam.CombinePerKey(_merge_summaries)
              | "AllSummaries" >> beam.combiners.ToList())
    side = beam.pvalue.AsSingleton(
        users | "Statistics" >> beam.Map(lambda u, r, s: _statistics(u, r, s, protocol, impressions),
                                         ranks, beam.pvalue.AsSingleton(merged)))

    files = (_time_split_shards(pipeline, sequences, side, last_time, protocol, directory, compression, impressions)
             if chronological else _user_split_shards(pipeline, sequences, side, protocol, directory, compression,
                                                      impressions))
    _ = (files | "Manifest" >> beam.Map(
        lambda f, side_, c, t: _write_manifest(f, side_, directory, {"rows": c[0], "bad_lines": c[1],
                                                                     "clicks": c[2]}, t, chronological),
        side, beam.pvalue.AsSingleton(counts), last_time))


def _dense(side: dict, items, categories, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A user's raw item and category ids as dense ids (the statistics' maps)."""
    return (np.array([side["item_dense"][int(i)] for i in items], dtype),
            np.array([side["category_dense"][int(c)] for c in categories], dtype))


def _user_split_shards(pipeline, sequences, side, protocol: Protocol, directory: str, compression: str,
                       impressions: bool):
    """The per-user protocol: the qualifying users grouped into the protocol's
    chunks, whose examples and negatives `chunk_examples` draws; returns the
    shard list."""
    import apache_beam as beam

    def to_chunks(seq, side_):
        user, _, items, categories, _, times, labels = seq
        uid = side_["user_dense"][user]
        index = side_["index"].get(uid)
        if index is None:
            return
        rows = UserRows(*_dense(side_, items, categories, np.int32), times=times if impressions else None,
                        labels=labels if impressions else None)
        yield index // USERS_PER_CHUNK, (index, uid, rows)

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


def _time_split_shards(pipeline, sequences, side, last_time, protocol: Protocol, directory: str, compression: str,
                       impressions: bool):
    """`--split=time` (`dare_tf.data.days`): each user's examples over its days,
    its negatives drawn by the clicks up to its day (a side input of every
    day's `ClicksToDate`: a vocabulary's counts per day, which bounds the
    days and items this driver takes), and every user's store record; returns
    the shard list."""
    import apache_beam as beam

    summaries = (sequences
                 | "DaySummaries" >> beam.FlatMap(lambda s: day_item_summaries(s[2], s[3], s[5], s[4], s[6]))
                 | "MergeDays" >> beam.CombinePerKey(merge_day_items)
                 | "AllDays" >> beam.combiners.ToList())
    to_date = beam.pvalue.AsSingleton(summaries | "ClicksByDay" >> beam.Map(
        lambda s, side_: clicks_by_day(s, side_["item_dense"], side_["category_dense"], side_["stats"].num_items),
        side))

    def user_outputs(seq, side_, clicks, last):
        user, _, items, categories, _, times, labels = seq
        uid = side_["user_dense"][user]
        rows = UserRows(*_dense(side_, items, categories, np.int64), times=np.asarray(times, np.int64),
                        labels=labels if impressions else None)
        k = int(partition_of(uid, protocol.partitions))
        for tag, table in user_examples(uid, rows, clicks, protocol, protocol.bounds(last)):
            yield (SEGMENT_KIND, tag, k), (uid, table)
        stored = rows.clicks()
        yield (STORE_KIND, None, k), (uid, stored)

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
            uid = np.array([u for u, _ in rows], np.int64)
            writer.write_store(uid, np.array([len(i) for _, (i, _) in rows], np.int64),
                               np.concatenate([i for _, (i, _) in rows] or [np.zeros(0, np.int64)]),
                               np.concatenate([c for _, (_, c) in rows] or [np.zeros(0, np.int64)]))
        else:
            table = np.concatenate([t for _, t in rows] or [np.zeros((0, len(EXAMPLE_COLUMNS)), np.int64)])
            writer.write_examples({c: table[:, i].astype(np.int32) for i, c in enumerate(EXAMPLE_COLUMNS)})
        return writer.close()

    return ((outputs, empty) | "WithEmptyShards" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.Map(write, last_time)
            | "ShardList" >> beam.combiners.ToList())


def _unwrap(error: BaseException) -> BaseException:
    """The exception a worker raised (Beam wraps it), e.g. a `BadLineError`."""
    from dare_tf.data.logs import BadLineError

    seen = error
    while seen is not None:
        if isinstance(seen, BadLineError):
            return seen
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    if "BadLineError: " in text:
        return BadLineError(text.split("BadLineError: ", 1)[1].splitlines()[0].rstrip("'\" []"))
    return error


def prepare(log: str | LogFormat, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False, pipeline_options=None, block_bytes: int | None = None,
            compression: str = "GZIP"):
    """`dare_tf.data.protocol.prepare` on Apache Beam (see the module docstring).

    Args:
        pipeline_options: a `beam.options.pipeline_options.PipelineOptions`
            (runner, project, ...); default: the DirectRunner. Workers must
            reach `input_path` and `output_dir` by the same paths.
        block_bytes: bytes per parsed block (default: `log_reader.BLOCK_BYTES`).
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dare_tf.data.log_reader import BLOCK_BYTES

    fmt = log_format(log)
    protocol.validate(fmt.impressions)
    check_compression(compression)
    guard_dataset_dir(output_dir, input_path)
    start = time.perf_counter()
    plan = plan_blocks(input_path, fmt, block_bytes or BLOCK_BYTES)
    preparation = preparation_id(plan.sha256, protocol, fmt, compression)

    def build(staging):
        options = pipeline_options or PipelineOptions(runner="DirectRunner")
        try:
            with beam.Pipeline(options=options) as pipeline:
                build_pipeline(pipeline, os.path.abspath(input_path), fmt, plan, protocol, staging,
                               skip_bad_lines, compression)
        except Exception as e:  # noqa: BLE001 - re-raised as the worker's own error where there is one
            error = _unwrap(e)
            if error is e:
                raise
            raise error from None
        with open(os.path.join(staging, MANIFEST)) as f:
            manifest = json.load(f)
        os.remove(os.path.join(staging, MANIFEST))
        kind = "impression" if fmt.impressions else "click"
        if manifest["rows"] == 0:
            raise ValueError(f"{input_path}: input log has no data rows")
        if manifest["clicks"] == 0 and not fmt.impressions:
            action = f" (action == {fmt.click!r})" if fmt.click is not None else ""
            raise ValueError(f"{input_path}: no {kind} rows{action} in {manifest['rows']} rows")
        if manifest["users"] == 0:
            raise no_user_qualifies(protocol, manifest["longest"], fmt.impressions and protocol.split == "user")
        bounds = protocol.bounds(manifest["last_time"]) if protocol.split == "time" else None
        fields = dict(num_items=manifest["num_items"], num_categories=manifest["num_categories"],
                      num_users=manifest["num_users"], users=manifest["users"],
                      **layout_fields(protocol, compression, manifest["files"], bounds),
                      **time_windows(protocol, bounds))
        source = dict(path=os.path.abspath(input_path), sha256=plan.sha256, rows=manifest["rows"],
                      clicks=manifest["clicks"], bad_lines=manifest["bad_lines"], log=fmt.to_json(),
                      **({"last_time": manifest["last_time"]} if bounds is not None else {}))
        if source["bad_lines"]:
            logging.warning("%s: skipped %d bad line(s)", input_path, source["bad_lines"])
        return make_spec(fmt, protocol, source, preparation, fields)

    spec = write_prepared(output_dir, input_path, build)
    logging.info("wrote %s with Beam in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
