r"""The history service's program: load a prepared dataset's histories, append live
clicks, show a user's history. STORE is lmdb:DIR (embedded) or redis://HOST:PORT.

Usage:
  python -m serving.histories load --data_dir=data/prepared/taobao --store=lmdb:histories
  python -m serving.histories append --store=lmdb:histories --input=clicks.csv --format=csv \
      --columns=user=0,item=1,category=2,time=4
  python -m serving.histories append --store=lmdb:histories --input=day_9.csv --dataset=taobao
  tail -f clicks.csv | python -m serving.histories append --store=redis://localhost:6379 --input=- \
      --format=csv --columns=user=0,item=1,category=2,time=4
  python -m serving.histories show --store=lmdb:histories --user_id=1 --max_len=50
  # a dataset with further fields: the store keeps them (created with the dataset's, or --fields)
  python -m serving.histories append --store=lmdb:histories --input=day.csv --dataset=tmall --fields=seller,brand

`load` writes every stored user's clicks in raw ids, with the dataset's column
fields (a store created now gets them); a dataset prepared with --time_gap
keeps its clicks' times, any other none: they load as 0, before any live click. `append` reads rows of
a log as `data.prepare` does: a preset (`--dataset=taobao`, a day of the log a
dataset was prepared from) or the `--columns` language (with `action=COL
--click=VALUE` only clicks are kept) and appends them as they arrive: from `-` (standard
input), each batch of lines that is ready is one atomic append. `show`
prints `{"user_id", "items", "categories", "times"}` as one JSON object,
oldest first.
"""

import json
import os
import select
import sys
import tempfile

from absl import app, flags

import dare_tf.cli
from dare_tf.data.logs.formats import FILE_FORMATS, FORMATS, log_format_of
from dare_tf.histories.base import DEFAULT_MAX_CLICKS

FLAGS = flags.FLAGS
COMMANDS = ("load", "append", "show")
flags.DEFINE_string("store", None, "The history store: lmdb:DIR, redis://HOST:PORT[/DB] or "
                    "redis-cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster).")
flags.DEFINE_integer("wait_replicas", 0, "load/append to a Redis Cluster: an append is acknowledged once each "
                     "user's clicks are on its master and on this many of its replicas (Redis WAIT); 0: on the "
                     "master (replicated asynchronously).", lower_bound=0)
flags.DEFINE_float("retry_s", 30.0, "load/append to a Redis Cluster: seconds an append rides through a failover "
                   "(MOVED, ASK, CLUSTERDOWN, lost connections retried) before it ends in one line.", lower_bound=0)
flags.DEFINE_string("data_dir", None, "load: a prepared dataset (data.prepare) whose store to load.")
flags.DEFINE_integer("max_clicks", None, "load/append to a new store: clicks kept per user, the oldest dropped "
                     f"(default {DEFAULT_MAX_CLICKS:,}: a lifelong history; a store made before keeps its own).",
                     lower_bound=1)
flags.DEFINE_string("input", None, "append: a click log file, or - for standard input.")
flags.DEFINE_enum("dataset", None, sorted(FORMATS), "append: a named log format (data.prepare's presets) "
                  "instead of --format/--columns.")
flags.DEFINE_enum("format", None, sorted(FILE_FORMATS),
                  "append: the log's file format (default csv; parquet: a file, not -).")
flags.DEFINE_string("columns", None, "append: ROLE=COLUMN pairs as data.prepare's --columns (user, item, time; "
                    "category; action with --click).")
flags.DEFINE_string("click", None, "append: with an action column, the action value that is a click.")
flags.DEFINE_list("fields", [], "append: a preset's further fields to read and keep (tmall: seller, brand); a "
                  "custom log names them in --columns=...,field:NAME=COL.")
flags.DEFINE_list("actions", [], "append: every action value, comma-separated, the --click one among them "
                  "(others are bad lines); with --action_field each row keeps its action as the field `action`, "
                  "coded in this order.")
flags.DEFINE_bool("action_field", False, "append: keep every action of the log (a preset's, or --actions), with its "
                  "action as the field `action` (a store loaded from a dataset prepared with --action_field).")
flags.DEFINE_bool("header", False, "append: the first line names the columns.")
flags.DEFINE_enum("time_unit", "s", ["s", "ms", "us", "ns"], "append: the unit of integer times: seconds, "
                  "milliseconds, microseconds or nanoseconds since 1970 (a time past the year 2200 is refused, "
                  "naming the unit that reads it).")
flags.DEFINE_string("time_zone", None, "append: the zone of calendar times that name none (an IANA name such as "
                    "Europe/Paris; default UTC).")
flags.DEFINE_string("time_format", None, "append: the time column's strptime format, as data.prepare's (default: "
                    "Unix seconds or ISO 8601 times).")
flags.DEFINE_bool("string_ids", False, "append: the log's ids are strings, as data.prepare's --string_ids (a new "
                  "store then keeps string ids).")
flags.DEFINE_integer("batch_lines", 1000, "append from -: the most lines one append holds.", lower_bound=1)
flags.DEFINE_string("user_id", None, "show: the raw user id.")
flags.DEFINE_integer("max_len", None, "show: the last this many clicks (default all).", lower_bound=1)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["store"])


def _configure(argv):
    """The command and its checked flags, before TensorFlow loads."""
    commands = argv[1:]
    if len(commands) != 1 or commands[0] not in COMMANDS:
        raise app.UsageError(f"give one command of {', '.join(COMMANDS)}; got {' '.join(commands) or 'none'}")
    command = commands[0]
    needs = {"load": ["data_dir"], "append": ["input"], "show": ["user_id"]}[command]
    missing = [f"--{n}" for n in needs if FLAGS[n].value is None]
    if missing:
        raise app.UsageError(f"{command} needs {', '.join(missing)}")
    fmt = None
    if command == "append":
        if FLAGS.input == "-" and FLAGS.format == "parquet":
            raise app.UsageError("--format=parquet reads a file: give --input=FILE, not -")
        file_format = FLAGS.format or ("csv" if FLAGS.columns is not None and FLAGS.dataset is None else None)
        try:
            fmt = log_format_of(FLAGS.dataset, file_format, FLAGS.columns, FLAGS.click, FLAGS.header, FLAGS.fields,
                                FLAGS.action_field, FLAGS.time_format, FLAGS.string_ids, FLAGS.time_unit,
                                FLAGS.time_zone, FLAGS.actions)
        except ValueError as e:
            raise app.UsageError(str(e)) from None
        if fmt.impressions:
            raise app.UsageError("--columns: a history holds clicks; a label column makes an impression log")
        if FLAGS.input != "-" and not os.path.isfile(FLAGS.input):
            raise ValueError(f"--input={FLAGS.input}: no such file")
    return command, fmt


def load(store):
    from dare_tf.histories.prepared import load_prepared

    loaded = load_prepared(store, FLAGS.data_dir)
    if not loaded.users:
        print(f"{store.url}: holds {FLAGS.data_dir} already (loaded before); nothing loaded")
        return
    print(f"{store.url}: loaded {loaded.users} users from {FLAGS.data_dir}: kept {loaded.kept} of {loaded.clicks} "
          f"clicks (the last {store.max_clicks} per user: --max_clicks)")


def _lines(stream, limit: int):
    """Batches of lines from `stream`: what is ready, at most `limit` lines each."""
    batch = []
    while True:
        line = stream.readline()
        if not line:
            break
        batch.append(line)
        ready = select.select([stream], [], [], 0)[0] if hasattr(stream, "fileno") else [stream]
        if len(batch) >= limit or not ready:
            yield batch
            batch = []
    if batch:
        yield batch


def append(store, fmt):
    from dare_tf.histories.prepared import append_log

    def append_file(path):
        return append_log(store, path, fmt)

    if FLAGS.input != "-":
        print(f"{store.url}: appended {append_file(FLAGS.input)} clicks from {FLAGS.input}")
        return
    stdin = sys.stdin.buffer  # (bytes as sent: the log reader refuses those that are not UTF-8, naming the line)
    header = stdin.readline() if fmt.header else b""
    total, line = 0, 1 + bool(header)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "batch")
        for batch in _lines(stdin, FLAGS.batch_lines):
            with open(path, "wb") as f:  # (one parser for files and streams: the log reader's)
                f.write(header + b"".join(batch))
            try:
                total += append_file(path)
            except ValueError as e:  # named as the user sees it: lines of standard input
                message = str(e).replace(path, f"standard input (the batch from line {line})")
                raise ValueError(f"{message}; {total + getattr(e, 'appended', 0)} clicks of standard input were "
                                 "appended in all") from None
            line += len(batch)
    print(f"{store.url}: appended {total} clicks from standard input")


def show(store):
    user = FLAGS.user_id if store.string_ids else dare_tf.cli.int64_flag("user_id", FLAGS.user_id)
    history = store.last([user], FLAGS.max_len)
    print(json.dumps(history.to_json(0, user)))


def main(configuration):
    from dare_tf.histories import open_store

    command, fmt = configuration
    max_clicks, fields, string_ids = FLAGS.max_clicks, None, None
    if command == "load":
        from dare_tf.data.storage.spec import DatasetSpec

        spec = DatasetSpec.load(FLAGS.data_dir)
        fields = spec.field_schema.columns
        string_ids = spec.string_ids
    elif command == "append":
        fields = tuple(fmt.field_columns) + (("action",) if fmt.action_field else ())
        string_ids = fmt.string_ids
    cluster = {"wait_replicas": FLAGS.wait_replicas, "retry_s": FLAGS.retry_s}
    with open_store(FLAGS.store, read_only=command == "show", max_clicks=max_clicks, fields=fields,
                    string_ids=string_ids, cluster=cluster) as store:
        {"load": lambda: load(store), "append": lambda: append(store, fmt), "show": lambda: show(store)}[command]()
        if command != "show" and hasattr(store, "acknowledgement"):  # (a cluster: what the counts above mean)
            print(f"acknowledged: {store.acknowledgement()}; {store.retried} transient cluster errors retried")


def run():
    # Only `load` reads TFRecords: `append` and `show` start without TensorFlow.
    dare_tf.cli.run(main, configure=_configure, tensorflow=lambda configuration: configuration[0] == "load",
                    models=False)


if __name__ == "__main__":
    run()
