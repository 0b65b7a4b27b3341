"""A TEST AND DEMO DOUBLE of TensorFlow Serving: PredictionService over exported SavedModels.

Not a server to deploy: use the `tensorflow/serving` container (README).

The real `tensorflow_model_server` binary cannot be installed on our build
machines. This server implements the official `tensorflow.serving.
PredictionService` gRPC protos (Predict, Classify, Regress, GetModelMetadata)
and the REST `:predict` endpoint for one or several models (a ranker and a
retrieval model, from TF Serving's own `models.config`), so that the client,
the export, `recommend` and the load benchmark can be tested end to end. It mimics the real
server's contract where our tests depend on it (INVALID_ARGUMENT for bad
inputs, NOT_FOUND for unknown models or signatures), merges concurrent
Predict requests as TF Serving's batching does, and switches to a model's
newest version when one appears under its base path (as TF Serving's default
`latest` version policy does, polling every `poll_s` seconds like its
`--file_system_poll_wait_seconds`): a request is answered by the version it
reached, the old or the new, never an error. It is not TF Serving: one
version at a time, no other version policy, only the names and base paths of
a `models.config`. Deploy with the
`tensorflow/serving` container (see the README).

Program: `python -m serving.standin_server` (serving/standin_server.py).
"""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import ThreadingHTTPServer

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)

from dare_tf.signatures import CLASSIFY_METHOD, PREDICT_METHOD, REGRESS_METHOD
from dare_tf.testing.batcher import Batcher
from dare_tf.testing.loaded_model import LoadedModel, watch_versions
from dare_tf.testing.requests import Limits, ServingError

def _examples(input_proto) -> np.ndarray:
    kind = input_proto.WhichOneof("kind")
    if kind is None:  # no examples at all: an empty result, as for an empty example_list
        return np.zeros((0,), dtype=object)
    if kind != "example_list":
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Input holds {kind}; this server takes an example_list")
    return np.array([e.SerializeToString() for e in input_proto.example_list.examples], dtype=object)


def _served(models: dict[str, LoadedModel], name: str) -> LoadedModel:
    if name not in models:
        raise ServingError(grpc.StatusCode.NOT_FOUND,
                           f"Servable not found for request: Latest({name}); serving {sorted(models)}")
    return models[name]


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """The gRPC service over the loaded models (by name), each with its own batcher."""

    def __init__(self, models: dict[str, LoadedModel], batching: bool = True, limits: Limits = Limits(),
                 pad_variable_length_inputs: bool = True, batch_timeout_s: float = 0.001):
        self.models, self.limits = models, limits
        self.batching, self.pad, self.batch_timeout_s = batching, pad_variable_length_inputs, batch_timeout_s
        for model in models.values():
            self.attach_batcher(model)

    def attach_batcher(self, model: LoadedModel) -> None:
        """Gives `model` its own batcher (with batching on)."""
        if self.batching:
            model.batcher = Batcher(model, self.limits.max_batch_size, self.batch_timeout_s,
                                    pad_variable_length_inputs=self.pad)

    def switch(self, model: LoadedModel, grace_s: float = 30.0) -> None:
        """Serves `model` (a newer version) from now on: requests that already hold the
        old version finish on it; its batcher stops `grace_s` later."""
        self.attach_batcher(model)
        old, self.models[model.name] = self.models.get(model.name), model  # (one atomic store)
        if old is not None and old.batcher is not None:
            threading.Timer(grace_s, old.batcher.stop).start()

    def _guard(self, context, fn):
        try:
            return fn()
        except ServingError as e:
            context.abort(e.code, str(e))

    @staticmethod
    def _spec(spec, model: LoadedModel, signature_name):
        spec.name = model.name
        spec.version.value = model.version
        spec.signature_name = signature_name

    def Predict(self, request, context):
        def handle():
            model = _served(self.models, request.model_spec.name)
            name, definition = model.signature(request.model_spec, PREDICT_METHOD)
            for key, proto in sorted(request.inputs.items()):
                self.limits.check_tensor(key, proto)
            try:
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            except Exception as e:  # a malformed TensorProto
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"bad input tensor: {e}") from e
            outputs = (model.batcher.run if model.batcher else model.run)(name, definition, inputs)
            wanted = list(request.output_filter) or list(outputs)
            response = predict_pb2.PredictResponse()
            self._spec(response.model_spec, model, name)
            for key in wanted:
                if key not in outputs:
                    raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"output_filter names unknown {key!r}")
                response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key]))
            return response
        return self._guard(context, handle)

    def _run_examples(self, request, method: str, response):
        """Runs a Classify/Regress request's tf.Examples; fills the response's model spec."""
        model = _served(self.models, request.model_spec.name)
        name, definition = model.signature(request.model_spec, method)
        examples = _examples(request.input)
        self.limits.check_batch("inputs", examples.shape)
        outputs = model.run(name, definition, {"inputs": examples})
        self._spec(response.model_spec, model, name)
        return outputs

    def Classify(self, request, context):
        def handle():
            response = classification_pb2.ClassificationResponse()
            outputs = self._run_examples(request, CLASSIFY_METHOD, response)
            for labels, scores in zip(outputs["classes"], outputs["scores"]):
                row = response.result.classifications.add()
                for label, score in zip(labels, scores):
                    row.classes.add(label=label.decode(), score=float(score))
            return response
        return self._guard(context, handle)

    def Regress(self, request, context):
        def handle():
            response = regression_pb2.RegressionResponse()
            outputs = self._run_examples(request, REGRESS_METHOD, response)
            for value in outputs["outputs"]:
                response.result.regressions.add(value=float(value))
            return response
        return self._guard(context, handle)

    def GetModelMetadata(self, request, context):
        def handle():
            model = _served(self.models, request.model_spec.name)
            if list(request.metadata_field) != ["signature_def"]:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   "Metadata field signature_def is the only one supported")
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            self._spec(response.model_spec, model, "")
            signatures = get_model_metadata_pb2.SignatureDefMap()
            for key, value in model.signature_defs.items():
                signatures.signature_def[key].CopyFrom(value)
            response.metadata["signature_def"].Pack(signatures)
            return response
        return self._guard(context, handle)


class _HTTPServer(ThreadingHTTPServer):
    request_queue_size = 256  # (the default 5 drops connections under load: 1 s SYN retries)
    daemon_threads = True


def serve(models: dict[str, str], port: int = 0, rest_port: int | None = None, workers: int = 16,
          batching: bool = True, limits: Limits = Limits(), pad_variable_length_inputs: bool = True,
          poll_s: float | None = 1.0, batch_timeout_s: float = 0.001):
    """Starts the gRPC (and optionally REST) stand-in serving `models` (name ->
    base path holding numeric versions; `read_model_config` reads them from a
    `models.config`) within `limits`, merging concurrent requests (`batching`,
    `Batcher`, waiting up to `batch_timeout_s` for a fuller batch), switching to
    a newer version every `poll_s` seconds (None: never; `watch_versions`);
    returns (grpc_server, grpc_port, http_server).

    Raises OSError when a port is already in use (no port sharing: two
    servers on one port would split the connections between them).
    """
    if not models:
        raise ValueError("no model to serve")
    loaded = {name: LoadedModel(base, name) for name, base in models.items()}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", limits.max_request_bytes),
                                  ("grpc.so_reuseport", 0)])
    service = PredictionService(loaded, batching, limits, pad_variable_length_inputs, batch_timeout_s)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(service, server)
    try:
        bound = server.add_insecure_port(f"localhost:{port}")
    except RuntimeError as e:  # grpc reports a failed bind this way
        raise OSError(f"gRPC port localhost:{port}: address in use ({e})") from e
    if not bound:
        raise OSError(f"gRPC port localhost:{port}: address in use")
    server.start()
    if poll_s is not None:
        watch, grpc_stop = watch_versions(service, dict(models), poll_s), server.stop

        def stop(grace):  # the watch ends with the server
            watch.set()
            return grpc_stop(grace)

        server.stop = stop
    http = None
    if rest_port is not None:
        from dare_tf.testing.rest import RestHandler

        handler = type("Handler", (RestHandler,), {"models": loaded, "limits": limits,
                                                   "workers": threading.BoundedSemaphore(limits.rest_workers)})
        try:
            http = _HTTPServer(("localhost", rest_port), handler)
        except OSError as e:
            server.stop(0)
            raise OSError(f"REST port localhost:{rest_port}: address in use ({e.strerror})") from e
        threading.Thread(target=http.serve_forever, daemon=True).start()
    return server, bound, http


def standin_process(port: int, *flags: str, cwd: str | None = None):
    """`python -m serving.standin_server FLAGS --port=PORT` in a process of its own
    (a replica a test or benchmark kills and starts again on its port), once its
    gRPC port answers."""
    import os
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-m", "serving.standin_server", *flags, f"--port={port}"], cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    line = server.stdout.readline()
    if f"gRPC localhost:{port}" not in line:
        server.kill()
        raise RuntimeError(f"the stand-in on port {port} did not start: {line!r}")
    return server
