r"""Sends a request to a served DARE-family model (gRPC or REST) and prints the answer.

Usage:
  python -m serving.client --server=localhost:8500 --model_name=dare --request_json=req.json
  python -m serving.client --rest_url=http://localhost:8501 --model_name=dare --request_json=req.json
  python -m serving.client --server=localhost:8500 --model_name=dare --metadata
  python -m serving.client recommend --server=localhost:8500 --model_name=dare \
      --retrieval_model=retrieval --request_json=user.json [--num_candidates=200 --top=10 --explain]
  python -m serving.client recommend --server=localhost:8500 --model_name=dare \
      --user_id=1 --histories=lmdb:histories   # the history from the history service

req.json holds lists `target_item`, `target_category` and lists of lists
`hist_items`, `hist_categories` (raw ids, oldest first, any lengths: integers,
or strings for a model of a --string_ids dataset);
a model with further fields also takes `target_<field>` (a list) and
`hist_<field>` (lists of lists beside `hist_items`; the time gap's
`hist_time_gap`: each click's age). For `recommend`, user.json holds one
user's `hist_items` and `hist_categories` (lists of raw ids, oldest first, and
`hist_<field>` of the ranker's fields), or --user_id names a user whose
history the history service (--histories, `python -m serving.histories`)
holds, read at call time (its fields with it; the time gap from the clicks'
times, at --now): the retrieval model picks --num_candidates items, the ranker
(--model_name) scores them in one `rank` request, and the --top are printed
by click probability, after a line that says how many of the user's clicks
were read (none: an unknown user, answered as an empty history).
"""

import json

from absl import app, flags

import dare_tf.cli
from dare_tf.signatures import EXPLAIN, SERVING_DEFAULT

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "localhost:8500", "The model server: gRPC HOST:PORT, or the replicas of one model "
                    "server, HOST:PORT,HOST:PORT,... (balanced round robin).")
flags.DEFINE_string("rest_url", None, "Use REST at this base URL (http://host:8501) instead of gRPC.")
flags.DEFINE_string("model_name", None, "Served model name (for recommend: the ranker).")
flags.DEFINE_enum("signature", SERVING_DEFAULT, [SERVING_DEFAULT, EXPLAIN], "Signature to call.")
flags.DEFINE_string("request_json", None, "JSON file with the request (see above).")
flags.DEFINE_bool("metadata", False, "Print the served model's name, version (the one answering now) and "
                  "signatures, and exit.")
flags.DEFINE_float("timeout", 5.0, "Seconds per call.", lower_bound=0.001)
flags.DEFINE_integer("retries", 3, "Retries after UNAVAILABLE.", lower_bound=0)
flags.DEFINE_string("retrieval_model", "retrieval", "recommend: the served retrieval model's name.")
flags.DEFINE_integer("num_candidates", 200, "recommend: candidates the retrieval model hands the ranker.",
                     lower_bound=1)
flags.DEFINE_integer("top", 10, "recommend: recommendations to print.", lower_bound=1)
flags.DEFINE_bool("explain", False, "recommend: also print the ranker's heaviest retrieved behaviours.")
flags.DEFINE_string("user_id", None, "recommend: a raw user id whose history --histories holds (instead of "
                    "--request_json).")
flags.DEFINE_string("histories", None, "recommend --user_id: the history store, lmdb:DIR, redis://HOST:PORT[/DB] or "
                    "redis-cluster://HOST:PORT[,HOST:PORT...].")
flags.DEFINE_integer("max_len", None, "recommend --user_id: send the user's last this many clicks (default: the "
                     "ranker's history length, as its export says; the ranker reads its own L of them).",
                     lower_bound=1)
flags.DEFINE_string("now", None, "recommend --user_id: the moment the clicks' ages (the time gap) are measured "
                    "at: Unix seconds or an ISO 8601 time (default: the current time).")
flags.DEFINE_enum("format", "table", ["table", "json"], "Output: markdown tables or JSON, in the request's raw "
                  "ids (with explain: each retrieved behaviour's item, category, clicks ago and weight).")
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["model_name"])


def _read_request(fields):
    with open(FLAGS.request_json) as f:
        try:
            request = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{FLAGS.request_json}: not valid JSON ({e})") from e
    if not isinstance(request, dict):
        raise ValueError(f"{FLAGS.request_json}: expected a JSON object with {list(fields)}, got "
                         f"{type(request).__name__}")
    missing = [k for k in fields if k not in request]
    if missing:
        raise ValueError(f"{FLAGS.request_json}: missing field(s) {missing}")
    return request


def _history(request, name):
    """A user's history: a flat list of integer ids."""
    value = request[name]
    if not isinstance(value, list) or any(isinstance(x, (list, dict)) for x in value):
        raise ValueError(f"{FLAGS.request_json}: {name} must be one user's history, a flat list of ids "
                         f"(oldest first), got {json.dumps(value)[:60]}")
    return value


def _command(argv):
    """The program's configuration: the command (`recommend` or None) and its
    request, checked before TensorFlow loads (a bad command, a missing flag or a
    malformed request file answers at once)."""
    from dare_tf.data.storage.schema import HIST_CATEGORIES, HIST_ITEMS, MODEL_INPUTS

    commands = argv[1:]
    if commands == ["recommend"]:
        if FLAGS.rest_url:
            raise app.UsageError("recommend talks gRPC (--server); --rest_url is for single-model requests")
        if FLAGS.user_id is not None:
            if FLAGS.request_json or not FLAGS.histories:
                raise app.UsageError("recommend --user_id reads the history from --histories (not --request_json)")
            now = None
            if FLAGS.now is not None:
                from dare_tf.data.logs.times import parse_time

                try:
                    now = parse_time(FLAGS.now)
                except ValueError as e:
                    raise app.UsageError(f"--now={FLAGS.now}: {e}") from None
            return "recommend", {"user_id": FLAGS.user_id, "now": now}  # (an int64 unless the store keeps strings)
        if not FLAGS.request_json:
            raise app.UsageError("recommend needs --request_json (or --user_id with --histories)")
        request = _read_request([HIST_ITEMS, HIST_CATEGORIES])
        for name in request:
            _history(request, name)
        return "recommend", request
    if commands:
        raise app.UsageError(f"unknown command {' '.join(commands)!r} (the only one is 'recommend')")
    if FLAGS.metadata:
        return None, None
    if not FLAGS.request_json:
        raise app.UsageError("--request_json is required (or --metadata)")
    return None, _read_request(MODEL_INPUTS)


def recommend(request):
    from dare_tf.data.storage.schema import HIST_CATEGORIES, HIST_ITEMS
    from dare_tf.serving.encoding import (candidates_line, format_recommendations, history_line, notes_line,
                                          vocabulary_line)
    from dare_tf.serving.recommender import Recommender
    from dare_tf.serving.client import ServingClient

    clients = [ServingClient(FLAGS.server, name, timeout=FLAGS.timeout, retries=FLAGS.retries)
               for name in (FLAGS.retrieval_model, FLAGS.model_name)]
    store = None
    try:
        if "user_id" in request:
            from dare_tf.histories import open_store

            store = open_store(FLAGS.histories, read_only=True)
            user = request["user_id"] if store.string_ids else dare_tf.cli.int64_flag("user_id", request["user_id"])
            recommender = Recommender(*clients, histories=store)
            result, history = recommender.recommend_user(
                user, FLAGS.num_candidates, FLAGS.top, FLAGS.explain, FLAGS.max_len, request["now"])
            request = dict(zip((HIST_ITEMS, HIST_CATEGORIES), history.row(0)))
            user = {"user_id": FLAGS.user_id, "history_clicks": int(history.lengths[0]),
                    "line": history_line(FLAGS.user_id, history, FLAGS.histories)}
        else:
            recommender = Recommender(*clients)
            result = recommender.recommend(request[HIST_ITEMS], request[HIST_CATEGORIES], FLAGS.num_candidates,
                                           FLAGS.top, FLAGS.explain, _fields(request))
            user = None
    finally:
        for client in clients:
            client.close()
        if store is not None:
            store.close()
    counts, unknown = result.pop("candidates"), result.pop("unknown", None)
    if FLAGS.format == "json":
        user = {k: v for k, v in (user or {}).items() if k != "line"}
        print(json.dumps({**user, **{k: v.tolist() for k, v in result.items()}, "candidates": counts,
                          **({"unknown": unknown} if unknown is not None else {}),
                          "ranker_notes": recommender.notes}, indent=2))
        return
    if user is not None:
        print(user["line"])
    print(candidates_line(counts))
    for said in (notes_line(FLAGS.model_name, recommender.notes), vocabulary_line(unknown)):
        if said:
            print(said)
    print(format_recommendations(result, request[HIST_ITEMS], request[HIST_CATEGORIES]))


def main(configuration):
    """`configuration`: `_command`'s (command, request)."""
    from dare_tf.data.storage.schema import HIST_ITEMS, MODEL_INPUTS
    from dare_tf.serving.encoding import in_own_history, request_tensors

    command, request = configuration
    if command == "recommend":
        return recommend(request)
    if FLAGS.metadata or not FLAGS.rest_url:  # (gRPC)
        from dare_tf.serving.client import ServingClient

        client = ServingClient(FLAGS.server, FLAGS.model_name, timeout=FLAGS.timeout, retries=FLAGS.retries)
        if FLAGS.metadata:
            print(json.dumps(client.metadata(), indent=2))
            return
    inputs = request_tensors(*(request[k] for k in MODEL_INPUTS), _fields(request))
    if FLAGS.rest_url:
        from dare_tf.serving.rest import rest_predict

        out = rest_predict(FLAGS.rest_url, FLAGS.model_name, inputs, FLAGS.signature, FLAGS.timeout)
    else:
        out = client.predict_tensors(inputs, FLAGS.signature)
    if "history_index" in out:
        out = in_own_history(out, inputs, request[HIST_ITEMS])
    print(_predictions(request, out))


def _fields(request: dict) -> dict:
    """A request's further fields: its entries beyond the model's four inputs."""
    from dare_tf.data.storage.schema import MODEL_INPUTS

    return {k: v for k, v in request.items() if k not in MODEL_INPUTS}


def _predictions(request: dict, out: dict) -> str:
    """Each target's P(click) and, from `explain`, its retrieved behaviours in the
    request's raw ids (how many clicks ago, weight): a table, or JSON."""
    from dare_tf.data.storage.schema import HIST_CATEGORIES, HIST_ITEMS, TARGET_CATEGORY, TARGET_ITEM
    from dare_tf.serving.encoding import explained_behaviours, format_explanation

    targets, categories = list(request[TARGET_ITEM]), list(request[TARGET_CATEGORY])
    histories = [(request[HIST_ITEMS][0 if len(request[HIST_ITEMS]) == 1 else i],
                  request[HIST_CATEGORIES][0 if len(request[HIST_CATEGORIES]) == 1 else i])
                 for i in range(len(targets))]
    rows = [{"target_item": targets[i], "target_category": categories[i],
             "probability": float(out["probability"][i])} for i in range(len(targets))]
    if "history_index" in out:
        for i, row in enumerate(rows):
            row["behaviours"] = explained_behaviours(out["history_index"][i], out["attention_weight"][i],
                                                     *histories[i])
    if FLAGS.format == "json":
        return json.dumps(rows, indent=2)
    lines = ["| target item | category | P(click) |", "|---|---|---|"]
    lines += [f"| {r['target_item']} | {r['target_category']} | {r['probability']:.4f} |" for r in rows]
    for r in rows if "history_index" in out else []:
        lines += ["", f"target {r['target_item']}: the behaviours it retrieved, by weight",
                  format_explanation(r["behaviours"])]
    return "\n".join(lines)


def _one_line_rpc_errors(configuration):
    """`main`, with a gRPC failure (an unreachable server, a refused request) as one line."""
    import grpc

    try:
        return main(configuration)
    except grpc.RpcError as e:
        raise ValueError(f"{FLAGS.server}: {e.code().name}: {e.details()}") from e


def run():
    dare_tf.cli.run(_one_line_rpc_errors, configure=_command, models=False, tensorflow=False)


if __name__ == "__main__":
    run()
