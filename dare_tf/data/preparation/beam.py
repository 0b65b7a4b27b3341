"""The preparation protocol as an Apache Beam pipeline, for logs larger than
one machine: `prepare(...)` writes the same store, examples, id maps and
spec.json as `dare_tf.data.preparation.in_memory.prepare` (tested record for record),
with the DirectRunner locally or any Beam runner (`pipeline_options`).

Program: `python -m data.prepare --runner=beam [--beam_options=...]`.

The driver reads the file once (its sha256 and its blocks cut at line ends,
`dare_tf.data.logs.reader.plan_blocks`); everything else runs on the workers,
which hand each other the rows through files of the work directory
(`dare_tf.data.preparation.beam_exchange`), so that the runner's shuffle and
side inputs carry file names and per-id summaries, never a row:

1. each block is parsed (`parse_block`) and its rows are cut into user
   buckets (`buckets`, by default one per 64 MB of log);
2. each bucket's rows from every block are sorted by user and into protocol
   order (file order; Tmall: by time);
3. the global statistics (`dare_tf.data.preparation.beam_statistics`: dense ids in
   order of first appearance, each item's last category, click counts, the
   qualifying users) are merged from per-bucket summaries, cut by id so that
   each cut is merged by one worker, into one file;
4. the qualifying users are regrouped by the protocol's chunks, whose
   examples and negatives `chunk_examples` draws (seeded per chunk, as in
   memory); with `--split=time` each user's days are built on their own
   instead (`dare_tf.data.preparation.days`, seeded per user and day), against
   every day's item counts;
5. each shard (one partition's users, in order) is written by one worker
   (steps 4 and 5: `dare_tf.data.preparation.beam_shards`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import numpy as np
from absl import logging

from dare_tf._faces import public
from dare_tf.data.logs.formats import ACTION_FIELD, LogFormat, check_fields
from dare_tf.data.logs.reader import MAX_BAD_SHARE, check_bad_share, merge_bad_reasons, parse_block, plan_blocks
from dare_tf.data.logs.string_ids import fingerprinted, from_fingerprints, named
from dare_tf.data.preparation.beam_exchange import (WORK_DIR, block_rows, bucket_count, by_bucket, forget_shared, get,
                                                    get_bucket, get_rows, put, put_rows, shared, sorted_bucket,
                                                    work_dir)
from dare_tf.data.preparation.beam_shards import TimeSplit, UserSplit
from dare_tf.data.preparation.beam_statistics import (cut, day_summaries, merge, protocol_keys, row_summaries,
                                                      statistics, user_summary, user_table)
from dare_tf.data.preparation.catalogue import clicks_by_day
from dare_tf.data.preparation.dataset_dir import guard_dataset_dir, write_prepared
from dare_tf.data.preparation.prepared import (check_compression, layout_fields, log_format, make_spec,
                                               write_field_maps, write_id_maps, write_item_clicks)
from dare_tf.data.preparation.protocol import (Protocol, no_user_qualifies, preparation_id, time_windows,
                                              users_by_clicks)
from dare_tf.data.storage.fields import column_entries, spec_fields

MANIFEST = ".beam-manifest.json"  # written by the pipeline into the staging directory, read and removed


class Steps:
    """The pipeline's steps before the statistics, each reading and writing the
    work directory's files (`beam_exchange`)."""

    def __init__(self, path: str, fmt: LogFormat, plan, work: str, buckets: int, skip_bad_lines: bool,
                 chronological: bool):
        self.path, self.fmt, self.plan, self.work, self.buckets = path, fmt, plan, work, buckets
        self.skip_bad_lines, self.chronological = skip_bad_lines, chronological

    def parse(self, element) -> dict:
        """Parses one block and writes its rows by user bucket; returns its counts,
        its last time, the bucket files and (`--string_ids`) its strings."""
        b, block = element
        clicks = parse_block(self.path, self.fmt, self.plan.names, block, self.skip_bad_lines)
        names = []
        if self.fmt.string_ids:  # (codes -> fingerprints, the same on every worker: `dare_tf.data.logs.string_ids`)
            clicks, names = fingerprinted(clicks)
        files = {j: put_rows(os.path.join(self.work, f"block-{b}-bucket-{j}"), rows)
                 for j, rows in by_bucket(block_rows(b, clicks), self.buckets)}
        return {"counts": (clicks.rows, clicks.bad_lines, int(clicks.clicked().sum())), "bad": clicks.bad_reasons,
                "last_time": int(clicks.time.max()) if len(clicks.time) else None, "files": files, "names": names}

    def sort_bucket(self, element):
        """`(bucket, file, per-user summary)`: one bucket's rows from every block,
        sorted by user and into protocol order (`sorted_bucket`)."""
        j, paths = element
        rows, starts = sorted_bucket([get_rows(p) for p in sorted(paths)], self.fmt.sort_by_time or self.chronological)
        path = put_rows(os.path.join(self.work, f"bucket-{j}"), {**rows, "starts": starts})
        return j, path, user_summary(rows, starts, self.chronological)

    def summaries(self, element, users_path: str) -> dict:
        _, path, _ = element
        rows, starts = get_bucket(path)
        keys = protocol_keys(rows, starts, shared(users_path), self.fmt.sort_by_time, self.chronological)
        return row_summaries(rows, keys)

    def day_summaries(self, element) -> dict:
        return day_summaries(get_bucket(element[1])[0])

    def merged(self, sequences, name: str, summarize, *side):
        """`summarize` (`Steps.summaries`, `Steps.day_summaries`) of every sorted
        bucket, cut by id (`cut`) into one file per bucket and cut, each cut merged
        over the buckets by one worker; the merged cuts as one file list."""
        import apache_beam as beam

        def cut_files(element, *args):
            for k, part in enumerate(cut(summarize(element, *args), self.buckets)):
                yield k, put(os.path.join(self.work, f"{name}-{k}-of-bucket-{element[0]}"), part)

        return (sequences | f"{name}" >> beam.FlatMap(cut_files, *side)
                | f"Group{name}" >> beam.GroupByKey()
                | f"Merge{name}" >> beam.Map(lambda e: put(os.path.join(self.work, f"{name}-{e[0]}"),
                                                           merge(get(p) for p in sorted(e[1]))))
                | f"All{name}" >> beam.combiners.ToList())


def _write_manifest(files, stats_path: str, directory: str, source: dict, last_time: int, chronological: bool,
                    names: dict | None = None) -> None:
    side = shared(stats_path)
    stats = side["stats"]
    raw_fields = {n: side["fields"][j]["order"] for j, n in enumerate(side["field_names"])}
    if len(stats.qualifying):
        raw = {"item": side["items"]["order"], "category": side["categories"]["order"],
               "user": side["users"]["order"]}
        fields = dict(raw_fields)
        if names is not None:  # (`--string_ids`: the fingerprints' strings)
            raw = {role: from_fingerprints(role, v, names) if role in names else v for role, v in raw.items()}
            fields = {n: from_fingerprints(n, v, names) for n, v in fields.items()}
        write_id_maps(directory, raw["item"], raw["category"], raw["user"], stats.item_category)
        write_field_maps(directory, fields, stats.item_fields, stats.num_items)
        if chronological:
            write_item_clicks(directory, np.diff(stats.item_cdf, prepend=0))
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({"files": {name: entry for shard in files for name, entry in shard.items()},
                   "num_items": stats.num_items, "num_categories": len(side["categories"]["order"]) + 2,
                   "num_users": stats.num_users, "users": int(len(stats.qualifying)), "longest": side["longest"],
                   "users_by_clicks": users_by_clicks(side["users"]["clicks"][1:]),  # (row 0: the padding)
                   "last_time": last_time, "vocabularies": {n: len(v) + 2 for n, v in raw_fields.items()},
                   "empty_fields": [n for n, v in raw_fields.items() if len(v) and v.max() < 0], **source}, f)


def build_pipeline(pipeline, path: str, fmt: LogFormat, plan, protocol: Protocol, directory: str,
                   skip_bad_lines: bool, compression: str, buckets: int = 1):
    """Adds the preparation to a `beam.Pipeline`; `buckets`: how many parts the
    users are cut into (each part's rows are sorted by one worker)."""
    import apache_beam as beam

    impressions, chronological = fmt.impressions, protocol.split == "time"
    work = work_dir(directory)
    steps = Steps(path, fmt, plan, work, buckets, skip_bad_lines, chronological)
    parsed = (pipeline | "Blocks" >> beam.Create(list(enumerate(plan.blocks)))
              | "Parse" >> beam.Map(steps.parse))
    names = None
    if fmt.string_ids:
        names = beam.pvalue.AsSingleton(parsed | "Names" >> beam.FlatMap(lambda p: p["names"])
                                        | "DistinctNames" >> beam.Distinct()
                                        | "AllNames" >> beam.combiners.ToList() | "NameMaps" >> beam.Map(named))
    counts = (parsed | "BlockCounts" >> beam.Map(lambda p: p["counts"])
              | "SumCounts" >> beam.CombineGlobally(
                  lambda vs: tuple(int(sum(x)) for x in zip(*vs)) if vs else (0, 0, 0)))
    bad = beam.pvalue.AsSingleton(parsed | "BadReasons" >> beam.Map(lambda p: p["bad"])
                                  | "AllBadReasons" >> beam.CombineGlobally(merge_bad_reasons))
    last_time = beam.pvalue.AsSingleton(
        parsed | "BlockLastTime" >> beam.Map(lambda p: p["last_time"])
        | "LastTime" >> beam.CombineGlobally(lambda ts: max((t for t in ts if t is not None), default=0)))
    sequences = (parsed
                 | "BucketFiles" >> beam.FlatMap(lambda p: p["files"].items())
                 | "GroupBuckets" >> beam.GroupByKey()
                 | "SortBuckets" >> beam.Map(steps.sort_bucket))
    # Dense user ids follow the users' first keys.
    users = beam.pvalue.AsSingleton(
        sequences | "UserSummaries" >> beam.Map(lambda s: s[2]) | "AllUsers" >> beam.combiners.ToList()
        | "UserTable" >> beam.Map(lambda s: put(os.path.join(work, "users"), user_table(s))))
    field_names = tuple(fmt.field_columns) + ((ACTION_FIELD,) if fmt.action_field else ())
    summaries = steps.merged(sequences, "Summaries", steps.summaries, users)
    stats = beam.pvalue.AsSingleton(summaries | "Statistics" >> beam.Map(
        lambda m, u: put(os.path.join(work, "statistics"),
                         statistics(merge(get(p) for p in m), get(u), protocol, impressions, field_names)), users))
    if chronological:
        days = steps.merged(sequences, "DaySummaries", steps.day_summaries)
        to_date = beam.pvalue.AsSingleton(days | "ClicksByDay" >> beam.Map(
            lambda d, s: put(os.path.join(work, "clicks-by-day"), clicks_by_day(merge(get(p) for p in d), shared(s))),
            stats))
        files = TimeSplit(protocol, impressions, work, field_names).shards(
            pipeline, sequences, stats, to_date, last_time, directory, compression)
    else:
        files = UserSplit(protocol, impressions, work, buckets).shards(pipeline, sequences, stats, directory,
                                                                       compression)
    _ = (files | "Manifest" >> beam.Map(
        lambda f, s, c, t, n, r: _write_manifest(f, s, directory, {"rows": c[0], "bad_lines": c[1], "clicks": c[2],
                                                                   "bad_reasons": r}, t, chronological, n),
        stats, beam.pvalue.AsSingleton(counts), last_time,
        names if names is not None else beam.pvalue.AsSingleton(pipeline | "NoNames" >> beam.Create([None])), bad))


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


def _run(options, staging: str, **pipeline_args) -> dict:
    """Runs the pipeline into `staging`; returns its manifest (the work files removed,
    and with them the temporary folders Beam makes and never removes: Python's
    temporary directory is the work folder's while the pipeline is built and run)."""
    import apache_beam as beam

    system_temp, tempfile.tempdir = tempfile.tempdir, work_dir(staging)
    try:
        with beam.Pipeline(options=options) as pipeline:
            build_pipeline(pipeline, directory=staging, **pipeline_args)
    except Exception as e:  # noqa: BLE001 - re-raised as the worker's own error where there is one
        error = _unwrap(e)
        if error is e:
            raise
        raise error from None
    finally:
        tempfile.tempdir = system_temp
        forget_shared()
    shutil.rmtree(os.path.join(staging, WORK_DIR))
    with open(os.path.join(staging, MANIFEST)) as f:
        manifest = json.load(f)
    os.remove(os.path.join(staging, MANIFEST))
    return manifest


@public("dare_tf.data", name="prepare_beam")
def prepare(log: str | LogFormat, input_path: str, output_dir: str, protocol: Protocol = Protocol(),
            skip_bad_lines: bool = False, pipeline_options=None, block_bytes: int | None = None,
            compression: str = "GZIP", buckets: int | None = None, max_bad_share: float = MAX_BAD_SHARE):
    """`dare_tf.data.preparation.in_memory.prepare` on Apache Beam (see the module docstring).

    Args:
        pipeline_options: a `beam.options.pipeline_options.PipelineOptions`
            (runner, project, ...); default: the DirectRunner. Workers must
            reach `input_path` and `output_dir` by the same paths (the work
            files go inside the staging directory beside `output_dir`).
        block_bytes: bytes per parsed block (default: `log_reader.BLOCK_BYTES`).
        buckets: how many parts the users are cut into, each sorted by one
            worker (default: `beam_exchange.default_buckets`); the output does not depend on it.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    from dare_tf.data.logs.reader import BLOCK_BYTES

    fmt = log_format(log)
    protocol.validate(fmt.impressions)
    check_compression(compression)
    guard_dataset_dir(output_dir, input_path)
    start = time.perf_counter()
    plan = plan_blocks(input_path, fmt, block_bytes or BLOCK_BYTES)
    buckets = bucket_count(input_path, plan, buckets)  # (refuses more than MAX_BUCKETS)
    preparation = preparation_id(plan.sha256, protocol, fmt, compression)

    def build(staging):
        manifest = _run(pipeline_options or PipelineOptions(runner="DirectRunner"), staging,
                        path=os.path.abspath(input_path), fmt=fmt, plan=plan, protocol=protocol,
                        skip_bad_lines=skip_bad_lines, compression=compression,
                        buckets=buckets)
        check_bad_share(input_path, manifest["rows"], manifest["bad_lines"], manifest["bad_reasons"], max_bad_share)
        _check_manifest(input_path, fmt, protocol, manifest)
        bounds = protocol.bounds(manifest["last_time"]) if protocol.split == "time" else None
        entries = spec_fields(column_entries(fmt, manifest["vocabularies"]), protocol.time_gap)
        fields = dict(num_items=manifest["num_items"], num_categories=manifest["num_categories"],
                      num_users=manifest["num_users"], users=manifest["users"],
                      users_by_clicks=manifest["users_by_clicks"],
                      **layout_fields(protocol, compression, manifest["files"], bounds, entries),
                      **time_windows(protocol, bounds))
        source = dict(path=os.path.abspath(input_path), sha256=plan.sha256, rows=manifest["rows"],
                      clicks=manifest["clicks"], bad_lines=manifest["bad_lines"], log=fmt.to_json(),
                      **({"last_time": manifest["last_time"]} if bounds is not None else {}))
        return make_spec(fmt, protocol, source, preparation, fields)

    spec = write_prepared(output_dir, input_path, build)
    logging.info("wrote %s with Beam in %.1fs: %s", output_dir, time.perf_counter() - start, spec.counts)
    return spec
