"""Runs the TEST AND DEMO DOUBLE of TensorFlow Serving (not a server to deploy).

Usage:
  python -m serving.standin_server --model_base=exports/dare --model_name=dare --port=8500 [--rest_port=8501]

Deploy with the tensorflow/serving container instead (see the README).
"""

from absl import flags

import dare_tf.cli

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base", None, "Directory holding numeric version directories.")
flags.DEFINE_string("model_name", None, "Model name clients use.")
flags.DEFINE_integer("port", 8500, "gRPC port (0 picks a free one).", lower_bound=0)
flags.DEFINE_integer("rest_port", None, "REST port (none: no REST).", lower_bound=0)
flags.DEFINE_bool("batching", True, "Merge concurrent Predict requests (like --enable_batching).")
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["model_base", "model_name"])


def main(argv):
    del argv
    from dare_tf.serving.standin_server import serve

    server, port, http = serve(FLAGS.model_base, FLAGS.model_name, FLAGS.port, FLAGS.rest_port,
                               batching=FLAGS.batching)
    print(f"serving {FLAGS.model_name} on gRPC localhost:{port}"
          + (f" and REST localhost:{http.server_address[1]}" if http else ""), flush=True)
    server.wait_for_termination()


def run():
    dare_tf.cli.run(main)


if __name__ == "__main__":
    run()
