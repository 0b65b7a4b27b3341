"""Sends a request to a served DARE-family model (gRPC or REST) and prints the answer.

Usage:
  python -m serving.client --server=localhost:8500 --model_name=dare --request_json=req.json
  python -m serving.client --rest_url=http://localhost:8501 --model_name=dare --request_json=req.json
  python -m serving.client --server=localhost:8500 --model_name=dare --metadata

req.json holds lists `target_item`, `target_category` and lists of lists
`hist_items`, `hist_categories` (raw integer ids, oldest first, any lengths).
"""

import json

from absl import app, flags

import dare_tf.cli

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "localhost:8500", "gRPC host:port.")
flags.DEFINE_string("rest_url", None, "Use REST at this base URL (http://host:8501) instead of gRPC.")
flags.DEFINE_string("model_name", None, "Served model name.")
flags.DEFINE_enum("signature", "serving_default", ["serving_default", "explain"], "Signature to call.")
flags.DEFINE_string("request_json", None, "JSON file with the request (see above).")
flags.DEFINE_bool("metadata", False, "Print the model's signatures and exit.")
flags.DEFINE_float("timeout", 5.0, "Seconds per call.", lower_bound=0.001)
flags.DEFINE_integer("retries", 3, "Retries after UNAVAILABLE.", lower_bound=0)
flags.adopt_module_key_flags(dare_tf.cli)
flags.mark_flags_as_required(["model_name"])


def main(argv):
    del argv
    from dare_tf.data.spec import MODEL_INPUTS
    from dare_tf.serving.client import ServingClient, request_tensors, rest_predict

    client = ServingClient(FLAGS.server, FLAGS.model_name, timeout=FLAGS.timeout, retries=FLAGS.retries)
    if FLAGS.metadata:
        print(json.dumps(client.metadata(), indent=2))
        return
    if not FLAGS.request_json:
        raise app.UsageError("--request_json is required (or --metadata)")
    with open(FLAGS.request_json) as f:
        try:
            request = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{FLAGS.request_json}: not valid JSON ({e})") from e
    missing = [k for k in MODEL_INPUTS if k not in request]
    if missing:
        raise ValueError(f"{FLAGS.request_json}: missing field(s) {missing}")
    inputs = request_tensors(*(request[k] for k in MODEL_INPUTS))
    if FLAGS.rest_url:
        out = rest_predict(FLAGS.rest_url, FLAGS.model_name, inputs, FLAGS.signature, FLAGS.timeout)
    else:
        out = {k: v.tolist() for k, v in client.predict_tensors(inputs, FLAGS.signature).items()}
    print(json.dumps(out, indent=2))


def run():
    dare_tf.cli.run(main)


if __name__ == "__main__":
    run()
