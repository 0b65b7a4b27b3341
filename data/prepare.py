r"""Prepares a raw click or impression log as a dataset of TFRecord files (the paper's protocol).

Usage:
  # a named preset
  python -m data.prepare --dataset=taobao --input=UserBehavior.csv --output_dir=data/prepared/taobao
  # any click log: CSV, TSV or Parquet, columns by header name (or 0-based index without --header)
  python -m data.prepare --format=csv --header --input=clicks.csv --output_dir=data/prepared/mine \
      --columns=user=user_id,item=item_id,category=cat,time=ts[,action=event --click=click]
  # further fields of every behaviour (a brand, a seller), and the time gap of each behaviour
  python -m data.prepare --dataset=tmall --fields=seller,brand --time_gap --input=user_log_format1.csv ...
  python -m data.prepare --format=csv --header --columns=user=uid,item=iid,category=cat,time=ts,field:brand=brand ...
  # every action (pv, buy, cart, fav) in the histories, as the field `action`; the examples stay the clicks
  python -m data.prepare --dataset=taobao --action_field --input=UserBehavior.csv ...
  # an impression log: a 0/1 label per row; its impressions are the examples
  python -m data.prepare --format=parquet --input=impressions.parquet --output_dir=data/prepared/imp \
      --columns=user=uid,item=iid,time=ts,label=clicked --min_clicks=5
  # the same on Apache Beam
  python -m data.prepare ... --runner=beam [--beam_options="--runner=DataflowRunner --project=..."]
  # a log read as days: the last day is the test window, the day before it validation
  python -m data.prepare --dataset=taobao --input=days_1_to_30.csv --output_dir=data/prepared/daily --split=time
  # ... and the next day appended to it (its format and protocol are the dataset's), and to the histories
  python -m data.prepare --append --input=day_31.csv --output_dir=data/prepared/daily [--histories=lmdb:histories]

--runner=beam runs the same protocol as an Apache Beam pipeline (DirectRunner
unless --beam_options name another runner) and writes the same records.

--output_dir is replaced only when it is absent, empty or a dataset this program wrote.
--append changes a --split=time dataset in place, journaled: a killed append
leaves it as it was, or is finished by the next (dare_tf.data.preparation.append).
"""

import contextlib
import os

import numpy as np
from absl import app, flags

import dare_tf.cli
from dare_tf.data.logs.formats import FILE_FORMATS, FORMATS, LogFormat, log_format_of
from dare_tf.data.preparation.protocol import Protocol, choices_line
from dare_tf.data.logs.reader import MAX_BAD_SHARE
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.preparation.prepared import MAX_BUCKETS
from dare_tf.data.storage.spec import SPEC_FILE, DatasetSpec
from dare_tf.data.storage.shards import COMPRESSIONS

FLAGS = flags.FLAGS
flags.DEFINE_enum("dataset", None, sorted(FORMATS), "A named log format (preset of --format/--columns/--click).")
flags.DEFINE_enum("format", None, sorted(FILE_FORMATS), "File format of a custom log (instead of --dataset).")
flags.DEFINE_string("columns", None, "Custom log: ROLE=COLUMN pairs, comma-separated; roles user, item, time "
                    "(required), category, action (with --click), label (0/1: an impression log), field:NAME (any "
                    "number of further categorical fields: integer ids, an empty cell is the item's own). COLUMN "
                    "is a header name (--header, Parquet) or a 0-based index.")
flags.DEFINE_list("fields", [], "A preset's further fields to read, comma-separated (tmall: seller, brand).")
flags.DEFINE_bool("action_field", False, "Keep every action of the log (a preset's: Taobao's pv, buy, cart, fav; a "
                  "custom log's --actions) in the histories, with the history-only field `action`; the examples "
                  "stay the clicks.")
flags.DEFINE_list("actions", [], "Custom log with an action column: every action value, comma-separated, the "
                  "--click one among them (others are bad lines); with --action_field each row keeps its action as "
                  "the field `action`, coded in this order.")
flags.DEFINE_string("click", None, "Custom log with an action column: the action value that is a click.")
flags.DEFINE_bool("header", False, "Custom CSV/TSV log: the first line names the columns.")
flags.DEFINE_enum("time_unit", "s", ["s", "ms", "us", "ns"], "Custom log: the unit of integer times: seconds, "
                  "milliseconds, microseconds or nanoseconds since 1970 (a time past the year 2200 is refused, "
                  "naming the unit that reads it).")
flags.DEFINE_string("time_zone", None, "Custom log: the zone of calendar times that name none (an IANA name such as "
                    "Europe/Paris; default UTC).")
flags.DEFINE_string("time_format", None, "Custom log: the time column's strptime format (e.g. '%d/%m/%Y %H:%M'); "
                    "default: Unix seconds or ISO 8601 times (2026-11-01T00:31:27Z; without a zone, UTC).")
flags.DEFINE_bool("string_ids", False, "Custom log: user, item, category and field ids are strings (SKUs, UUIDs; "
                  "any text without whitespace; 007 and 7 are two ids); the id maps hold them, the exports take them.")
flags.DEFINE_string("input", None, "Raw log file.")
flags.DEFINE_string("output_dir", None, "Directory to write (see above).")
flags.DEFINE_enum("compression", "gzip", sorted(COMPRESSIONS), "Compression of the TFRecord files.")
flags.DEFINE_bool("skip_bad_lines", False, "Skip and count malformed lines instead of stopping (at most "
                  "--max_bad_share of the log's lines: more is refused, naming the most common problem).")
flags.DEFINE_float("max_bad_share", MAX_BAD_SHARE, "--skip_bad_lines: the largest share of the log's lines it may skip "
                   "(more is a wrong column, not a few bad lines).", lower_bound=0.0, upper_bound=1.0)
# (absl's bounds let nan through: it compares false with both)
flags.register_validator("max_bad_share", lambda share: 0 <= share <= 1, message="must be a number from 0 to 1")
flags.DEFINE_enum("runner", "in_memory", ["in_memory", "beam"],
                  "in_memory: one process; beam: an Apache Beam pipeline (same output).")
flags.DEFINE_string("beam_options", "", "Beam pipeline options, space-separated (--runner=beam only).")
flags.DEFINE_integer("beam_buckets", None, "--runner=beam: how many parts the users are cut into, each sorted by one "
                     f"worker (default: one per 64 MB of log; at most {MAX_BUCKETS:,}, and at most one per 16 KiB of "
                     "log: more are capped, saying so); the output does not depend on it.", lower_bound=1,
                     upper_bound=MAX_BUCKETS)
flags.DEFINE_bool("append", False, "Append the day(s) of --input to the --split=time dataset in --output_dir "
                  "(its log format and protocol; new days only).")
flags.DEFINE_string("histories", None, "--append: also append the day's clicks to this history service "
                    "(lmdb:DIR or redis://HOST:PORT, serving.histories), after the dataset.")
flags.DEFINE_bool("allow_late", False, "--append: drop the rows on or before the dataset's last day (counted in "
                  "spec.json's source.appended) instead of refusing the log.")
PROTOCOL_FLAGS = dare_tf.cli.define_flags(Protocol)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["input", "output_dir"])


def log_format_from_flags() -> LogFormat:
    """The log's format: a preset (`--dataset`) or `--format` with `--columns`."""
    try:
        return log_format_of(FLAGS.dataset, FLAGS.format, FLAGS.columns, FLAGS.click, FLAGS.header, FLAGS.fields,
                             FLAGS.action_field, FLAGS.time_format, FLAGS.string_ids, FLAGS.time_unit,
                             FLAGS.time_zone, FLAGS.actions)
    except ValueError as e:
        raise app.UsageError(str(e)) from None


def append_day() -> None:
    from dare_tf.data.preparation.append import append

    given = [f"--{name}" for name in (*PROTOCOL_FLAGS, "runner", "beam_options", "beam_buckets", "compression")
             if FLAGS[name].present]
    if given:
        raise app.UsageError(f"--append takes the dataset's protocol and files: drop {', '.join(given)}")
    named = (FLAGS.dataset is not None or FLAGS.format is not None or FLAGS.time_format is not None
             or FLAGS.string_ids or FLAGS.time_unit != "s" or FLAGS.time_zone is not None or FLAGS.actions)
    before = DatasetSpec.load(FLAGS.output_dir) if os.path.exists(os.path.join(FLAGS.output_dir, SPEC_FILE)) else None
    # The history store is opened first: one that cannot be opened refuses the day before the dataset takes it.
    with contextlib.ExitStack() as stack:
        store = None
        if FLAGS.histories is not None:
            from dare_tf.histories import open_store

            store = stack.enter_context(open_store(FLAGS.histories))
        read = {}  # (the day's rows, parsed once for the dataset and the history service)
        spec = append(FLAGS.input, FLAGS.output_dir, log_format_from_flags() if named else None, FLAGS.allow_late,
                      FLAGS.skip_bad_lines, read=read, max_bad_share=FLAGS.max_bad_share)
        print(f"{FLAGS.output_dir}: {spec.users} users, {spec.num_items - 2} items, "
              f"{spec.num_categories - 2} categories, examples {spec.counts}, days appended "
              f"{len(spec.source.get('appended', []))}")
        if store is None:
            return
        if before is not None and spec.preparation == before.preparation:
            print(f"{FLAGS.histories}: not appended: {FLAGS.input} was in the dataset already (if the run that added "
                  "it stopped before its histories, append them with serving.histories append)")
            return
        from dare_tf.histories.prepared import append_clicks

        print(f"{store.url}: appended {append_clicks(store, read['clicks'], FLAGS.input)} clicks")


def main(argv):
    del argv
    if FLAGS["max_bad_share"].present and not FLAGS.skip_bad_lines:
        raise app.UsageError("--max_bad_share is for --skip_bad_lines")
    if FLAGS.append:
        return append_day()
    for name in ("allow_late", "histories"):
        if FLAGS[name].present:
            raise app.UsageError(f"--{name} is for --append")
    if FLAGS.beam_buckets is not None and FLAGS.runner != "beam":
        raise app.UsageError("--beam_buckets is for --runner=beam")
    fmt = log_format_from_flags()
    protocol = dare_tf.cli.from_flags(Protocol)
    try:
        protocol.validate(fmt.impressions)
    except ValueError as e:
        raise app.UsageError(dare_tf.cli.flag_message(str(e))) from None
    compression = COMPRESSIONS[FLAGS.compression]
    if FLAGS.runner == "beam":
        import logging as python_logging

        quiet = not FLAGS["verbosity"].present
        root, beam_logger = python_logging.getLogger(), python_logging.getLogger("apache_beam")
        level = root.level
        if quiet:  # Beam warns on import (root logger) and logs a failed step's traceback before its error
            root.setLevel(python_logging.ERROR)
            beam_logger.setLevel(python_logging.CRITICAL)
        try:
            from apache_beam.options.pipeline_options import PipelineOptions

            from dare_tf.data.preparation import beam
        finally:
            root.setLevel(level)

        options = PipelineOptions(FLAGS.beam_options.split() or ["--runner=DirectRunner"])
        spec = beam.prepare(fmt, FLAGS.input, FLAGS.output_dir, protocol, FLAGS.skip_bad_lines, options,
                            compression=compression, buckets=FLAGS.beam_buckets, max_bad_share=FLAGS.max_bad_share)
    else:
        spec = prepare(fmt, FLAGS.input, FLAGS.output_dir, protocol, FLAGS.skip_bad_lines, compression,
                       FLAGS.max_bad_share)
    fields = "".join(f", {f['name']} ({len(f['edges'])} buckets)" if "edges" in f else
                     f", {f['name']} ({f['vocabulary'] - 2} values)" for f in spec.fields)
    print(f"{FLAGS.output_dir}: {spec.users} users, {spec.num_items - 2} items, "
          f"{spec.num_categories - 2} categories{fields}, examples {spec.counts}, {spec.partitions} partitions")
    choices = choices_line(spec.source.get("users_by_clicks"), protocol, spec.users)
    if choices:  # (fewer than half of the log's users kept: what lower settings would keep)
        print(choices)
    if fmt.action_field:
        print(action_counts(fmt, spec))


def action_counts(fmt, spec) -> str:
    """What each action contributed to the stored histories (`--action_field`)."""
    from dare_tf.data.logs.formats import ACTION_FIELD
    from dare_tf.data.storage.fields import field_id_file
    from dare_tf.data.storage.id_maps import read_id_file
    from dare_tf.data.storage.store import SequenceStore

    # The field's dense ids follow the actions' first appearance in the log; its id map gives each
    # one's raw code, the action's place in --actions (1-based).
    raw = [int(code) for code in read_id_file(os.path.join(FLAGS.output_dir, field_id_file(ACTION_FIELD)))]
    dense = np.bincount(SequenceStore.load(FLAGS.output_dir, spec).fields[ACTION_FIELD], minlength=len(raw) + 1)
    by_code = {code: int(dense[k]) for k, code in enumerate(raw, 1)}
    role = {fmt.click: " (the clicks: examples and history)"}
    return "the histories' clicks by action: " + ", ".join(
        f"{name} {by_code.get(i + 1, 0)}{role.get(name, ' (history)')}" for i, name in enumerate(fmt.actions))


def run():
    dare_tf.cli.run(main, tensorflow=False)  # numpy, pyarrow, google-crc32c: no TensorFlow runtime (memory)


if __name__ == "__main__":
    run()
