"""The preparation protocol as an Apache Beam pipeline, for logs larger than
one machine: `prepare(...)` writes the same store, examples, id maps and
spec.json as `dare_tf.data.preparation.in_memory.prepare` (tested record for record),
with the DirectRunner locally or any Beam runner (`pipeline_options`).

Program: `python -m data.prepare --runner=beam [--beam_options=...]`.

The driver reads the file once (its sha256 and its blocks cut at line ends,
`dare_tf.data.logs.reader.plan_blocks`); everything else runs on the workers:

1. each block is parsed (`parse_block`) and its clicks are grouped by user;
2. each user's clicks are put in protocol order (file order; Tmall: by time);
3. the global statistics (`LogStatistics`: dense ids in order of first
   appearance, each item's last category, click counts, the qualifying
   users) are combined from per-user summaries into one side input;
4. users are grouped into the protocol's chunks, whose examples and
   negatives `chunk_examples` draws (seeded per chunk, as in memory);
   with `--split=time` each user's days are built on their own instead
   (`dare_tf.data.preparation.days`, seeded per user and day), against every day's
   item counts (a side input);
5. each shard (one partition's users, in order) is written by one worker
   (steps 4 and 5: `dare_tf.data.preparation.beam_shards`)
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

from dare_tf._faces import public
from dare_tf.data.logs.reader import parse_block, plan_blocks
from dare_tf.data.logs.formats import check_fields
from dare_tf.data.logs.formats import LogFormat
from dare_tf.data.preparation.dataset_dir import guard_dataset_dir, write_prepared
from dare_tf.data.preparation.prepared import (check_compression, layout_fields, log_format,
    make_spec, write_field_maps, write_id_maps, write_item_clicks)
from dare_tf.data.preparation.beam_shards import time_split_shards, user_split_shards
from dare_tf.data.preparation.beam_statistics import merge_summaries, statistics, user_ranks, user_summaries
from dare_tf.data.storage.fields import column_entries, spec_fields
from dare_tf.data.logs.formats import ACTION_FIELD
from dare_tf.data.preparation.protocol import Protocol, no_user_qualifies, preparation_id, time_windows
from dare_tf.data.logs.string_ids import fingerprinted, from_fingerprints, named

MANIFEST = ".beam-manifest.json"  # written by the pipeline into the staging directory, read and removed


def _block_users(block_index: int, clicks):
    """`(raw user, (file keys, items, categories, times, labels, fields))` of one
    parsed block (`fields`: `[rows, F]` the further fields' raw ids, in order)."""
    keys = (np.int64(block_index) << 32) + np.arange(len(clicks.user), dtype=np.int64)
    labels = clicks.label if clicks.label is not None else clicks.clicked().astype(np.int64)  # (1: a click)
    fields = np.stack([clicks.fields[n] for n in clicks.fields], 1) if clicks.fields else np.zeros(
        (len(clicks.user), 0), np.int64)
    order = np.argsort(clicks.user, kind="stable")
    users, starts = np.unique(clicks.user[order], return_index=True)
    for u, rows in zip(users, np.split(order, starts[1:])):
        yield int(u), (keys[rows], clicks.item[rows], clicks.category[rows], clicks.time[rows], labels[rows],
                       fields[rows])


def _user_sequence(element, sort_by_time: bool, chronological: bool = False):
    """A user's rows in protocol order (file order, or stably by time):
    `(raw user, first key, items, categories, file keys, times, labels, fields)`.
    The first key orders the users: the first file key, or `chronological` (a
    `--split=time` log, read in time order) the first (time, file key)."""
    user, parts = element
    keys, items, categories, times, labels, fields = (np.concatenate([p[i] for p in parts]) for i in range(6))
    order = np.lexsort((keys, times)) if sort_by_time or chronological else np.argsort(keys)
    first = (int(times[order[0]]), int(keys[order[0]])) if chronological else int(keys.min())
    return user, first, items[order], categories[order], keys[order], times[order], labels[order], fields[order]


def _write_manifest(files, side: dict, directory: str, source: dict, last_time: int, chronological: bool,
                    names: dict | None = None) -> None:
    if len(side["stats"].qualifying):
        raw = {role: side[f"raw_{kind}"] for role, kind in (("item", "items"), ("category", "categories"),
                                                              ("user", "users"))}
        fields = dict(side["raw_fields"])
        if names is not None:  # (`--string_ids`: the fingerprints' strings)
            raw = {role: from_fingerprints(role, v, names) if role in names else v for role, v in raw.items()}
            fields = {n: from_fingerprints(n, v, names) for n, v in fields.items()}
        write_id_maps(directory, raw["item"], raw["category"], raw["user"], side["stats"].item_category)
        write_field_maps(directory, fields, side["stats"].item_fields, side["stats"].num_items)
        if chronological:
            write_item_clicks(directory, np.diff(side["stats"].item_cdf, prepend=0))
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({"files": {name: entry for shard in files for name, entry in shard.items()},
                   "num_items": side["stats"].num_items,
                   "num_categories": len(side["raw_categories"]) + 2, "num_users": side["stats"].num_users,
                   "users": int(len(side["stats"].qualifying)), "longest": side["longest"], "last_time": last_time,
                   "vocabularies": {n: len(v) + 2 for n, v in side["raw_fields"].items()},
                   "empty_fields": [n for n, v in side["raw_fields"].items() if v and max(v) < 0], **source}, f)


def build_pipeline(pipeline, path: str, fmt: LogFormat, plan, protocol: Protocol, directory: str,
                   skip_bad_lines: bool, compression: str):
    """Adds the preparation to a `beam.Pipeline`."""
    import apache_beam as beam

    impressions, chronological = fmt.impressions, protocol.split == "time"
    blocks = pipeline | "Blocks" >> beam.Create(list(enumerate(plan.blocks)))
    parsed = blocks | "Parse" >> beam.Map(
        lambda b: (b[0], parse_block(path, fmt, plan.names, b[1], skip_bad_lines)))
    names = None
    if fmt.string_ids:  # (each block's codes -> fingerprints, the same on every worker: `dare_tf.data.logs.string_ids`)
        printed = parsed | "Fingerprint" >> beam.Map(lambda p: (p[0], *fingerprinted(p[1])))
        parsed = printed | "Fingerprinted" >> beam.Map(lambda p: (p[0], p[1]))
        names = beam.pvalue.AsSingleton(printed | "Names" >> beam.FlatMap(lambda p: p[2])
                                        | "DistinctNames" >> beam.Distinct()
                                        | "AllNames" >> beam.combiners.ToList() | "NameMaps" >> beam.Map(named))
    counts = (parsed | "BlockCounts" >> beam.Map(lambda p: (p[1].rows, p[1].bad_lines, int(p[1].clicked().sum())))
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
    ranks = beam.pvalue.AsSingleton(users | "Ranks" >> beam.Map(user_ranks))
    merged = (sequences | "Summaries" >> beam.FlatMap(user_summaries, ranks, fmt.sort_by_time, chronological)
              | "MergeSummaries" >> beam.CombinePerKey(merge_summaries)
              | "AllSummaries" >> beam.combiners.ToList())
    field_names = tuple(fmt.field_columns) + ((ACTION_FIELD,) if fmt.action_field else ())
    side = beam.pvalue.AsSingleton(
        users | "Statistics" >> beam.Map(lambda u, r, s: statistics(u, r, s, protocol, impressions, field_names),
                                         ranks, beam.pvalue.AsSingleton(merged)))

    files = (time_split_shards(pipeline, sequences, side, last_time, protocol, directory, compression, impressions,
                                field_names)
             if chronological else user_split_shards(pipeline, sequences, side, protocol, directory, compression,
                                                      impressions))
    _ = (files | "Manifest" >> beam.Map(
        lambda f, side_, c, t, n: _write_manifest(f, side_, directory, {"rows": c[0], "bad_lines": c[1],
                                                                        "clicks": c[2]}, t, chronological, n),
        side, beam.pvalue.AsSingleton(counts), last_time,
        names if names is not None else beam.pvalue.AsSingleton(pipeline | "NoNames" >> beam.Create([None]))))


def _unwrap(error: BaseException) -> BaseException:
    """The exception a worker raised (Beam wraps it), e.g. a `BadLineError`."""
    from dare_tf.data.logs.formats import BadLineError

    seen = error
    while seen is not None:
        if isinstance(seen, BadLineError):
            return seen
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    if "BadLineError: " in text:
        return BadLineError(text.split("BadLineError: ", 1)[1].splitlines()[0].rstrip("'\" []"))
    return error


def _check_manifest(input_path: str, fmt: LogFormat, protocol: Protocol, manifest: dict) -> None:
    """The pipeline's counts refused as the in-memory driver refuses them: no rows,
    an empty field, no clicks, no qualifying user."""
    if manifest["rows"] == 0:
        raise ValueError(f"{input_path}: input log has no data rows")
    check_fields(input_path, fmt, manifest["empty_fields"])
    if manifest["clicks"] == 0 and not fmt.impressions:
        action = f" (action == {fmt.click!r})" if fmt.click is not None else ""
        raise ValueError(f"{input_path}: no click rows{action} in {manifest['rows']} rows")
    if manifest["users"] == 0:
        raise no_user_qualifies(protocol, manifest["longest"], fmt.impressions and protocol.split == "user")


@public("dare_tf.data", name="prepare_beam")
def prepare(log: str | LogFormat, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False, pipeline_options=None, block_bytes: int | None = None,
            compression: str = "GZIP"):
    """`dare_tf.data.preparation.in_memory.prepare` on Apache Beam (see the module docstring).

    Args:
        pipeline_options: a `beam.options.pipeline_options.PipelineOptions`
            (runner, project, ...); default: the DirectRunner. Workers must
            reach `input_path` and `output_dir` by the same paths.
        block_bytes: bytes per parsed block (default: `log_reader.BLOCK_BYTES`).
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dare_tf.data.logs.reader import BLOCK_BYTES

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
        _check_manifest(input_path, fmt, protocol, manifest)
        bounds = protocol.bounds(manifest["last_time"]) if protocol.split == "time" else None
        entries = spec_fields(column_entries(fmt, manifest["vocabularies"]), protocol.time_gap)
        fields = dict(num_items=manifest["num_items"], num_categories=manifest["num_categories"],
                      num_users=manifest["num_users"], users=manifest["users"],
                      **layout_fields(protocol, compression, manifest["files"], bounds, entries),
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
