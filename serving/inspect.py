r"""A page on localhost that shows why a user gets their recommendations.

Usage:
  python -m serving.inspect --server=localhost:8500 --model_name=dare \
      --histories=lmdb:histories [--compare=twin] [--port=8080]

Open the printed address and enter a user id: the user's history from the
history service as a timeline, the recommended items (retrieval rank, the
ranker's probability, the source that proposed each) and, for the selected
candidate, the behaviours its search kept (`rank_explain`), highlighted on the
timeline, with their attention weights; --compare shows a second served ranker
on the same history and candidates. It needs what `serving.client recommend
--user_id` needs: a served ranker and retrieval model (--retrieval_model) and
the history store, which the page only reads (every load reads it again). The
page's data is also JSON at /api/users/<id> (HTTP 400, 404, 502 or 503 with
{"error": ...} when it cannot answer). It serves --workers requests at once,
awaits their headers without a worker, and drops a connection whose header has
not arrived within --request_timeout_s of its acceptance.
"""

from absl import app, flags

import dare_tf.cli
from dare_tf.serving.inspect import PAGE_REQUEST_TIMEOUT_S, PAGE_WORKERS

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "localhost:8500", "The model server: gRPC HOST:PORT, or the replicas of one model "
                    "server, HOST:PORT,HOST:PORT,... (balanced round robin).")
flags.DEFINE_string("model_name", None, "The served ranker.")
flags.DEFINE_string("retrieval_model", "retrieval", "The served retrieval model.")
flags.DEFINE_string("compare", None, "A second served ranker, shown beside the first (e.g. twin).")
flags.DEFINE_string("histories", None, "The history store, lmdb:DIR, redis://HOST:PORT[/DB] or "
                    "redis-cluster://HOST:PORT[,HOST:PORT...] (read only).")
flags.DEFINE_string("host", "127.0.0.1", "The address the page listens on.")
flags.DEFINE_integer("port", 8080, "The page's port (0 picks a free one).", lower_bound=0)
flags.DEFINE_float("timeout", 5.0, "Seconds per call to the model server.", lower_bound=0.001)
flags.DEFINE_integer("workers", PAGE_WORKERS, "Connections the page serves at once (a fixed pool of threads; "
                     "the others wait in a queue).", lower_bound=1)
flags.DEFINE_float("request_timeout_s", PAGE_REQUEST_TIMEOUT_S, "Seconds from a connection's acceptance until its "
                   "request is read: a connection not read by then (a silent client, or one queued behind busy "
                   "workers) is dropped.", lower_bound=0.001)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["model_name", "histories"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from dare_tf.histories import open_store
    from dare_tf.serving.inspect import Inspector, page_server

    _check_port(FLAGS.host, FLAGS.port)
    store = open_store(FLAGS.histories, read_only=True)
    inspector = Inspector.connect(FLAGS.server, FLAGS.model_name, store, FLAGS.retrieval_model, FLAGS.compare,
                                  FLAGS.timeout)
    server = page_server(inspector, FLAGS.host, FLAGS.port, FLAGS.workers, FLAGS.request_timeout_s)
    print(f"inspect: open http://{FLAGS.host}:{server.server_port}/ (ranker {FLAGS.model_name}"
          + (f" beside {FLAGS.compare}" if FLAGS.compare else "") + f", models at {FLAGS.server}, histories "
          f"{FLAGS.histories}); Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    finally:
        inspector.close()
        store.close()


def _check_port(host: str, port: int) -> None:
    """Refuses a port in use in one line (werkzeug would print three and exit)."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ValueError(f"--host={host} --port={port}: cannot listen there ({e.strerror}); pick another port, "
                             "or --port=0 for a free one") from None


def run():
    dare_tf.cli.run(main, models=False)


if __name__ == "__main__":
    run()
