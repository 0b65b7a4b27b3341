"""Runs the TEST AND DEMO DOUBLE of TensorFlow Serving (not a server to deploy).

Usage:
  python -m serving.standin_server --model_base=exports/dare --model_name=dare --port=8500 [--rest_port=8501]
  python -m serving.standin_server --model_config_file=exports/models.config --port=8500

The second form serves every model of the models.config that `serving.export`
writes (a ranker and a retrieval model: `serving.client recommend` chains them).
Deploy with the tensorflow/serving container instead (see the README).
"""

from absl import app, flags

import dare_tf.cli
from dare_tf.signatures import MAX_BATCH_SIZE

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base", None, "Directory holding numeric version directories (one model).")
flags.DEFINE_string("model_name", None, "Model name clients use (with --model_base).")
flags.DEFINE_string("model_config_file", None, "A TF Serving models.config: serve every model it lists "
                    "(base paths under /models/ are read relative to the file's directory).")
flags.DEFINE_integer("port", 8500, "gRPC port (0 picks a free one).", lower_bound=0)
flags.DEFINE_integer("rest_port", None, "REST port (none: no REST).", lower_bound=0)
flags.DEFINE_bool("batching", True, "Merge concurrent Predict requests (like --enable_batching).")
flags.DEFINE_string("batching_parameters_file", None, "A TF Serving batching parameters file (as serving.export "
                    "writes it): batching on, with its max_batch_size (instead of --max_batch_size), its "
                    "pad_variable_length_inputs and its batch_timeout_micros (without the file: 1 ms).")
flags.DEFINE_integer("max_batch_size", MAX_BATCH_SIZE, "Rows one request may hold, and the batcher merges (TF Serving: "
                     "max_batch_size of its batching parameters); a larger request gets INVALID_ARGUMENT.",
                     lower_bound=1)
flags.DEFINE_integer("max_request_bytes", 64 << 20, "Bytes of one gRPC message (RESOURCE_EXHAUSTED above) or "
                     "REST body (HTTP 413 above).", lower_bound=1024)
flags.DEFINE_integer("rest_workers", None, "REST requests read and run at once (TF Serving: its REST thread "
                     "pool); the others wait, bounding REST's memory (default: dare_tf.testing.requests.Limits').",
                     lower_bound=1)
flags.DEFINE_float("request_timeout_s", None, "Seconds a REST request waits for a worker (then 503) and a "
                   "connection may stall mid-request (then closed) (default: dare_tf.testing.requests.Limits').",
                   lower_bound=0.001)
flags.DEFINE_float("file_system_poll_wait_seconds", 1.0, "Seconds between looks for a newer version of each "
                   "model (TF Serving's flag of the same name); 0: never (serve the version found at start).",
                   lower_bound=0)
flags.adopt_module_key_flags(dare_tf.cli)


def main(argv):
    del argv
    from dare_tf.testing.requests import Limits
    from dare_tf.testing.model_config import read_batching_parameters, read_model_config
    from dare_tf.testing.standin_server import serve

    if bool(FLAGS.model_config_file) == bool(FLAGS.model_base or FLAGS.model_name):
        raise app.UsageError("give either --model_config_file or both --model_base and --model_name")
    if FLAGS.model_config_file:
        models = read_model_config(FLAGS.model_config_file)
    elif not (FLAGS.model_base and FLAGS.model_name):
        raise app.UsageError("--model_base and --model_name go together")
    else:
        models = {FLAGS.model_name: FLAGS.model_base}
    batch = read_batching_parameters(FLAGS.batching_parameters_file) if FLAGS.batching_parameters_file else None
    server, port, http = serve(models, FLAGS.port, FLAGS.rest_port, batching=FLAGS.batching or batch is not None,
                               limits=Limits(batch.max_batch_size if batch else FLAGS.max_batch_size,
                                             FLAGS.max_request_bytes, **{
                                                 name: FLAGS[name].value for name in ("rest_workers",
                                                                                      "request_timeout_s")
                                                 if FLAGS[name].value is not None}),
                               pad_variable_length_inputs=batch.pad_variable_length_inputs if batch else True,
                               batch_timeout_s=batch.batch_timeout_micros / 1e6 if batch else 0.001,
                               poll_s=FLAGS.file_system_poll_wait_seconds or None)
    print(f"serving {', '.join(sorted(models))} on gRPC localhost:{port}"
          + (f" and REST localhost:{http.server_address[1]}" if http else ""), flush=True)
    server.wait_for_termination()


def run():
    dare_tf.cli.run(main, models=False)


if __name__ == "__main__":
    run()
