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

import dataclasses
import os
import re
import threading
from concurrent import futures
from http.server import ThreadingHTTPServer

import grpc
import numpy as np
from absl import logging
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)
from tensorflow_serving.config import model_server_config_pb2

from dare_tf.signatures import MAX_BATCH_SIZE, SERVING_DEFAULT, versions
from dare_tf.testing.batcher import Batcher
from dare_tf.testing.requests import Limits, ServingError

CONTAINER_ROOT = "/models/"


def read_model_config(path: str) -> dict[str, str]:
    """Model name -> base path from a TF Serving `models.config` (text
    `ModelServerConfig`). Base paths under `/models/` (the container's mount
    point, as `serving.export` writes them) are read relative to the config
    file's directory, which the README's `docker run` mounts there."""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        with open(path) as f:
            text_format.Parse(f.read(), config)
    except text_format.ParseError as e:
        raise ValueError(f"{path}: not a TF Serving model config ({e})") from e
    entries = config.model_config_list.config
    if not entries:
        raise ValueError(f"{path}: lists no model (model_config_list {{ config {{ name ... base_path ... }} }})")
    models = {}
    for entry in entries:
        if not entry.name or not entry.base_path:
            raise ValueError(f"{path}: every config needs a name and a base_path")
        if entry.name in models:
            raise ValueError(f"{path}: model {entry.name!r} is listed twice")
        base = entry.base_path
        if base.startswith(CONTAINER_ROOT):
            root = os.path.dirname(os.path.abspath(path))
            base = os.path.normpath(os.path.join(root, base[len(CONTAINER_ROOT):]))
            if os.path.commonpath([root, base]) != root:
                raise ValueError(f"{path}: model {entry.name!r}: base_path {entry.base_path!r} leaves the "
                                 "mounted directory")
        models[entry.name] = base
    return models


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """What the stand-in reads of a TF Serving batching parameters file."""

    max_batch_size: int = MAX_BATCH_SIZE
    pad_variable_length_inputs: bool = True


def read_batching_parameters(path: str) -> BatchingParameters:
    """`max_batch_size` and `pad_variable_length_inputs` of a TF Serving batching
    parameters file (text `BatchingParameters`, as `serving.export` writes it)."""
    with open(path) as f:
        text = f.read()
    match = re.search(r"\bmax_batch_size\s*\{\s*value\s*:\s*(\d+)\s*\}", text)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"{path}: no max_batch_size {{ value: N }} (a TF Serving batching parameters file)")
    pad = re.search(r"\bpad_variable_length_inputs\s*:\s*(\w+)", text)
    return BatchingParameters(int(match.group(1)), pad is not None and pad.group(1) == "true")


def latest_version(model_base: str) -> int:
    found = versions(model_base)
    if not found:
        raise FileNotFoundError(f"{model_base}: no numeric version directory")
    return found[-1]


class LoadedModel:
    """One SavedModel version and its signature definitions."""

    def __init__(self, model_base: str, model_name: str, version: int | None = None):
        self.name = model_name
        self.version = latest_version(model_base) if version is None else version
        path = os.path.join(model_base, str(self.version))
        self.module = tf.saved_model.load(path)
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        self.signature_defs = {k: v for k, v in proto.meta_graphs[0].signature_def.items()
                               if not k.startswith("__")}
        self.lock = threading.Lock()
        self.batcher: Batcher | None = None  # its own (`PredictionService`), so a request keeps the pair

    def signature(self, model_spec, method: str):
        if model_spec.name != self.name:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {model_spec.name}")
        if model_spec.HasField("version") and model_spec.version.value != self.version:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Servable not found: {model_spec.name} version {model_spec.version.value}")
        name = model_spec.signature_name or SERVING_DEFAULT
        if name not in self.signature_defs:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Serving signature key \"{name}\" not found.")
        definition = self.signature_defs[name]
        if definition.method_name != method:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Expected {method} signature method_name, got {definition.method_name}")
        return name, definition

    def run(self, name: str, definition, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = set(definition.inputs)
        if set(inputs) != expected:
            missing, extra = sorted(expected - set(inputs)), sorted(set(inputs) - expected)
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "the request's inputs do not match signature "
                               f"{name!r}: " + "; ".join(
                                   [f"missing {', '.join(missing)}"] * bool(missing)
                                   + [f"not in the signature: {', '.join(extra)}"] * bool(extra))
                               + f" (it takes {', '.join(sorted(expected))})")
        feed = {}
        for key, value in inputs.items():
            want = tf.dtypes.as_dtype(definition.inputs[key].dtype)
            if value.dtype != want.as_numpy_dtype and not (want == tf.string and value.dtype == object):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"Expects arg[{key}] to be {want.name} but {tf.as_dtype(value.dtype).name} "
                                   "is provided")
            feed[key] = tf.constant(value, want)
        try:
            outputs = self.module.signatures[name](**feed)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            message = " ".join(getattr(e, "message", str(e)).split())
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, message[:2000]) from e
        return {k: v.numpy() for k, v in outputs.items()}


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
                 pad_variable_length_inputs: bool = True):
        self.models, self.limits = models, limits
        self.batching, self.pad = batching, pad_variable_length_inputs
        for model in models.values():
            self.attach_batcher(model)

    def attach_batcher(self, model: LoadedModel) -> None:
        """Gives `model` its own batcher (with batching on)."""
        if self.batching:
            model.batcher = Batcher(model, self.limits.max_batch_size, pad_variable_length_inputs=self.pad)

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
            name, definition = model.signature(request.model_spec, "tensorflow/serving/predict")
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
            outputs = self._run_examples(request, "tensorflow/serving/classify", response)
            for labels, scores in zip(outputs["classes"], outputs["scores"]):
                row = response.result.classifications.add()
                for label, score in zip(labels, scores):
                    row.classes.add(label=label.decode(), score=float(score))
            return response
        return self._guard(context, handle)

    def Regress(self, request, context):
        def handle():
            response = regression_pb2.RegressionResponse()
            outputs = self._run_examples(request, "tensorflow/serving/regress", response)
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


def watch_versions(service: PredictionService, bases: dict[str, str], poll_s: float) -> threading.Event:
    """Every `poll_s` seconds, serves each model's newest version under its base path
    once one appears (`PredictionService.switch`); a version directory appears whole
    (the export renames it into place). A version that does not load (a copy in
    progress, a broken file) is logged and tried again at every poll, while the
    model's current version goes on serving and the other models are watched, as
    TF Serving does. Returns the event that stops the watch."""
    stop = threading.Event()
    failed: dict[tuple[str, int], str] = {}  # (model, version) -> why it did not load, logged once

    def loop():
        while not stop.wait(poll_s):
            for name, base in bases.items():
                found = versions(base)
                if not found or found[-1] <= service.models[name].version:
                    continue
                try:
                    service.switch(LoadedModel(base, name, found[-1]))
                except Exception as e:  # noqa: BLE001 (a version that does not load: the others go on)
                    why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                    if failed.get((name, found[-1])) != why:
                        failed[(name, found[-1])] = why
                        logging.error("model %s: version %d under %s did not load (%s); still serving "
                                      "version %d, and trying again every %g s", name, found[-1], base, why,
                                      service.models[name].version, poll_s)

    threading.Thread(target=loop, daemon=True, name="version-watch").start()
    return stop


def serve(models: dict[str, str], port: int = 0, rest_port: int | None = None, workers: int = 16,
          batching: bool = True, limits: Limits = Limits(), pad_variable_length_inputs: bool = True,
          poll_s: float | None = 1.0):
    """Starts the gRPC (and optionally REST) stand-in serving `models` (name ->
    base path holding numeric versions; `read_model_config` reads them from a
    `models.config`) within `limits`, merging concurrent requests (`batching`,
    `Batcher`), switching to a newer version every `poll_s` seconds (None:
    never; `watch_versions`); returns (grpc_server, grpc_port, http_server).

    Raises OSError when a port is already in use (no port sharing: two
    servers on one port would split the connections between them).
    """
    if not models:
        raise ValueError("no model to serve")
    loaded = {name: LoadedModel(base, name) for name, base in models.items()}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", limits.max_request_bytes),
                                  ("grpc.so_reuseport", 0)])
    service = PredictionService(loaded, batching, limits, pad_variable_length_inputs)
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
