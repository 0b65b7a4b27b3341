"""The preparation protocol as an Apache Beam pipeline, for logs larger than
one machine: `prepare(...)` writes the same store, examples, id maps and
spec.json as `dare_tf.data.protocol.prepare` (tested record for record),
with the DirectRunner locally or any Beam runner (`pipeline_options`).

Program: `python -m data.prepare --runner=beam [--beam_options=...]`.

The driver reads the file once (its sha256 and its blocks cut at line ends,
`dare_tf.data.logs.plan_blocks`); everything else runs on the workers:
1. each block is parsed (`parse_block`) and its clicks are grouped by user;
2. each user's clicks are put in protocol order (file order; Tmall: by time);
3. the global statistics (`LogStatistics`: dense ids in order of first
   appearance, each item's last category, click counts, the qualifying
   users) are combined from per-user summaries into one side input;
4. users are grouped into the protocol's chunks, whose examples and
   negatives `chunk_examples` draws (seeded per chunk, as in memory);
5. each shard (whole users, in order) is written by one worker.
Step 3's rankings hold one entry per distinct user, item and category on
one worker (the id maps), not one per click.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import logging

from dare_tf.data.logs import FORMATS, parse_block, plan_blocks
from dare_tf.data.protocol import (USERS_PER_CHUNK, LogStatistics, Protocol, check_output_dir, chunk_examples,
                                   make_spec, no_user_qualifies, preparation_id, write_id_maps, write_prepared,
                                   write_user_shard)
from dare_tf.data.spec import SPLITS

MANIFEST = ".beam-manifest.json"  # written by the pipeline into the staging directory, read and removed


def _block_users(block_index: int, clicks):
    """`(raw user, (file keys, items, categories, times))` of one parsed block."""
    keys = (np.int64(block_index) << 32) + np.arange(len(clicks.user), dtype=np.int64)
    order = np.argsort(clicks.user, kind="stable")
    users, starts = np.unique(clicks.user[order], return_index=True)
    for u, rows in zip(users, np.split(order, starts[1:])):
        yield int(u), (keys[rows], clicks.item[rows], clicks.category[rows], clicks.time[rows])


def _user_sequence(element, tmall: bool):
    """A user's clicks in protocol order (file order; Tmall: stably by time):
    `(raw user, first file key, items, categories, file keys)`."""
    user, parts = element
    keys, items, categories, times = (np.concatenate([p[i] for p in parts]) for i in range(4))
    order = np.lexsort((keys, times)) if tmall else np.argsort(keys)
    return user, int(keys.min()), items[order], categories[order], keys[order]


def _user_summaries(sequence, ranks: dict, tmall: bool):
    """Per distinct item and category of one user: `(first protocol key, last
    protocol key, category at the last, clicks)`. Protocol keys order all
    clicks as the in-memory driver sees them: file order (Taobao), or user
    rank then position (Tmall's time-sorted log)."""
    user, _, items, categories, file_keys = sequence
    keys = (np.int64(ranks[user]) << 32) + np.arange(len(items), dtype=np.int64) if tmall else file_keys
    for kind, ids in (("item", items), ("category", categories)):
        uniq, firsts = np.unique(ids, return_index=True)
        last = len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]
        counts = np.bincount(np.searchsorted(uniq, ids), minlength=len(uniq))
        for i, f, lst, c in zip(uniq, firsts, last, counts):
            yield (kind, int(i)), (int(keys[f]), int(keys[lst]), int(categories[lst]) if kind == "item" else 0, int(c))


def _merge_summaries(values):
    values = list(values)
    first = min(v[0] for v in values)
    last = max(values, key=lambda v: v[1])
    return first, last[1], last[2], sum(v[3] for v in values)


def _user_ranks(users: dict) -> dict:
    """Raw user -> rank (dense id - 1), in order of first appearance, from
    `{raw user: (first file key, clicks)}`."""
    return {u: r for r, u in enumerate(sorted(users, key=lambda u: users[u][0]))}


def _statistics(users, ranks, summaries, protocol: Protocol) -> dict:
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
    lengths = np.array([users[u][1] for u in raw_users], np.int64)
    qualifying = np.flatnonzero(lengths >= protocol.min_clicks) + 1  # dense ids, ascending
    return {"stats": LogStatistics(item_category=item_category, item_cdf=np.cumsum(counts), qualifying=qualifying,
                                   num_users=len(raw_users) + 1),
            "raw_items": [raw for _, raw, _ in items], "raw_categories": [raw for _, raw in categories],
            "raw_users": raw_users, "item_dense": item_dense, "category_dense": category_dense,
            "user_dense": {u: r + 1 for u, r in ranks.items()},
            "index": {int(u): i for i, u in enumerate(qualifying)}, "longest": int(lengths.max())}


def _chunk_outputs(element, side: dict, protocol: Protocol):
    """Examples and store rows of one chunk, keyed by the shard they belong to."""
    chunk, members = element
    members = sorted(members)  # (qualifying index, dense uid, items, categories)
    stats = side["stats"]
    users = np.array([m[1] for m in members], np.int64)
    items = [m[2] for m in members]
    categories = [m[3] for m in members]
    examples = chunk_examples(chunk, users, items, categories, stats, protocol)
    for split, columns in examples.items():
        per_user = protocol.examples_per_user(split)
        for j, (index, *_rest) in enumerate(members):
            rows = {k: v[j * per_user: (j + 1) * per_user] for k, v in columns.items()}
            yield (split, index // protocol.users_per_shard(split)), (index, rows)
    for index, uid, its, cats in members:
        yield ("store", index // protocol.users_per_store_shard), (index, {
            "uid": np.array([uid], np.int32), "length": np.array([len(its)], np.int32),
            "items": its.astype(np.int32), "categories": cats.astype(np.int32)})


def _write_shard(element, directory: str, preparation: str):
    (kind, shard), parts = element
    parts = [p for _, p in sorted(parts, key=lambda p: p[0])]
    return (kind, shard, *write_user_shard(directory, kind, shard, parts, preparation))


def _write_manifest(shards, side: dict, directory: str, source: dict) -> None:
    if len(side["stats"].qualifying):
        write_id_maps(directory, side["raw_items"], side["raw_categories"], side["raw_users"])
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({"shards": sorted(shards), "num_items": side["stats"].num_items,
                   "num_categories": len(side["raw_categories"]) + 2, "num_users": side["stats"].num_users,
                   "users": int(len(side["stats"].qualifying)), "longest": side["longest"], **source}, f)


def build_pipeline(pipeline, path: str, fmt, plan, protocol: Protocol, directory: str, preparation: str,
                   skip_bad_lines: bool):
    """Adds the preparation to a `beam.Pipeline`."""
    import apache_beam as beam

    tmall = fmt.name == "tmall"
    blocks = pipeline | "Blocks" >> beam.Create(list(enumerate(plan.blocks)))
    parsed = blocks | "Parse" >> beam.Map(lambda b: (b[0], parse_block(path, fmt, b[1], skip_bad_lines)))
    counts = (parsed | "BlockCounts" >> beam.Map(lambda p: (p[1].rows, p[1].bad_lines, len(p[1].user)))
              | "SumCounts" >> beam.CombineGlobally(lambda vs: tuple(int(sum(x)) for x in zip(*vs)) if vs else (0, 0, 0)))
    sequences = (parsed
                 | "ByUser" >> beam.FlatMap(lambda p: _block_users(p[0], p[1]))
                 | "GroupUsers" >> beam.GroupByKey()
                 | "Order" >> beam.Map(_user_sequence, tmall=tmall))
    # Raw user -> (first file key, clicks); dense user ids follow the first keys.
    users = (sequences | "UserFirst" >> beam.Map(lambda s: (s[0], (s[1], len(s[2]))))
             | "UserMap" >> beam.combiners.ToDict())
    ranks = beam.pvalue.AsSingleton(users | "Ranks" >> beam.Map(_user_ranks))
    merged = (sequences | "Summaries" >> beam.FlatMap(_user_summaries, ranks, tmall)
              | "MergeSummaries" >> beam.CombinePerKey(_merge_summaries)
              | "AllSummaries" >> beam.combiners.ToList())
    side = beam.pvalue.AsSingleton(
        users | "Statistics" >> beam.Map(lambda u, r, s: _statistics(u, r, s, protocol),
                                         ranks, beam.pvalue.AsSingleton(merged)))

    def to_chunks(seq, side_):
        user, _, items, categories, _ = seq
        uid = side_["user_dense"][user]
        index = side_["index"].get(uid)
        if index is None:
            return
        dense_items = np.array([side_["item_dense"][int(i)] for i in items], np.int32)
        dense_categories = np.array([side_["category_dense"][int(c)] for c in categories], np.int32)
        yield index // USERS_PER_CHUNK, (index, uid, dense_items, dense_categories)

    shards = (sequences
              | "ToChunks" >> beam.FlatMap(to_chunks, side)
              | "GroupChunks" >> beam.GroupByKey()
              | "Chunks" >> beam.FlatMap(_chunk_outputs, side, protocol)
              | "GroupShards" >> beam.GroupByKey()
              | "WriteShards" >> beam.Map(_write_shard, directory, preparation)
              | "ShardList" >> beam.combiners.ToList())
    _ = (shards | "Manifest" >> beam.Map(
        lambda s, side_, c: _write_manifest(s, side_, directory, {"rows": c[0], "bad_lines": c[1], "clicks": c[2]}),
        side, beam.pvalue.AsSingleton(counts)))


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


def prepare(dataset: str, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False, pipeline_options=None, block_bytes: int | None = None):
    """`dare_tf.data.protocol.prepare` on Apache Beam (see the module docstring).

    Args:
        pipeline_options: a `beam.options.pipeline_options.PipelineOptions`
            (runner, project, ...); default: the DirectRunner. Workers must
            reach `input_path` and `output_dir` by the same paths.
        block_bytes: bytes per parsed block (default: `logs.BLOCK_BYTES`).
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dare_tf.data.logs import BLOCK_BYTES

    if dataset not in FORMATS:
        raise ValueError(f"dataset={dataset!r}: expected one of {sorted(FORMATS)}")
    protocol.validate()
    check_output_dir(output_dir, input_path)
    fmt = FORMATS[dataset]
    start = time.perf_counter()
    plan = plan_blocks(input_path, fmt, block_bytes or BLOCK_BYTES)
    preparation = preparation_id(plan.sha256, protocol, dataset)

    def build(staging):
        options = pipeline_options or PipelineOptions(runner="DirectRunner")
        try:
            with beam.Pipeline(options=options) as pipeline:
                build_pipeline(pipeline, os.path.abspath(input_path), fmt, plan, protocol, staging, preparation,
                               skip_bad_lines)
        except Exception as e:  # noqa: BLE001 - re-raised as the worker's own error where there is one
            error = _unwrap(e)
            if error is e:
                raise
            raise error from None
        with open(os.path.join(staging, MANIFEST)) as f:
            manifest = json.load(f)
        os.remove(os.path.join(staging, MANIFEST))
        if manifest["rows"] == 0:
            raise ValueError(f"{input_path}: input log has no data rows")
        if manifest["clicks"] == 0:
            raise ValueError(f"{input_path}: no click rows ({fmt.action} == {fmt.click!r}) in {manifest['rows']} rows")
        if manifest["users"] == 0:
            raise no_user_qualifies(protocol, manifest["longest"])
        by_kind = {}
        for kind, shard, name, size, count in manifest["shards"]:
            by_kind.setdefault(kind, []).append((shard, name, size, count))
        fields = dict(num_items=manifest["num_items"], num_categories=manifest["num_categories"],
                      num_users=manifest["num_users"], users=manifest["users"],
                      counts={s: sum(c for *_, c in by_kind.get(s, [])) for s in SPLITS},
                      shards={s: [n for _, n, _, _ in sorted(by_kind.get(s, []))] for s in SPLITS},
                      store=[n for _, n, _, _ in sorted(by_kind["store"])],
                      clicks_stored=sum(c for *_, c in by_kind["store"]),
                      files={n: size for kind in by_kind.values() for _, n, size, _ in kind})
        source = dict(path=os.path.abspath(input_path), sha256=plan.sha256, rows=manifest["rows"],
                      clicks=manifest["clicks"], bad_lines=manifest["bad_lines"])
        if source["bad_lines"]:
            logging.warning("%s: skipped %d bad line(s)", input_path, source["bad_lines"])
        return make_spec(dataset, protocol, source, preparation, fields)

    spec = write_prepared(output_dir, input_path, build)
    logging.info("wrote %s with Beam in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
