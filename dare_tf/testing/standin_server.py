"""A TEST AND DEMO DOUBLE of TensorFlow Serving: PredictionService over exported SavedModels.

Not a server to deploy: use the `tensorflow/serving` container (README).

The real `tensorflow_model_server` binary cannot be installed on our build
machines. This server implements the official `tensorflow.serving.
PredictionService` gRPC protos (Predict, Classify, Regress, GetModelMetadata)
and the REST `:predict` endpoint for one or several models (a ranker and a
retrieval model, from TF Serving's own `models.config`), so that the client,
the export, `recommend` and the load benchmark can be tested end to end. It mimics the real
server's contract where our tests depend on it (INVALID_ARGUMENT for bad
inputs, NOT_FOUND for unknown models or signatures) and merges concurrent
Predict requests as TF Serving's batching does, but it is not TF Serving:
no version policies, no hot reload, only the names and base paths of a
`models.config`. Deploy with the
`tensorflow/serving` container (see the README).

Program: `python -m serving.standin_server` (serving/standin_server.py).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import threading
import time
from concurrent import futures
from http.server import ThreadingHTTPServer

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)
from tensorflow_serving.config import model_server_config_pb2

from dare_tf.signatures import MAX_BATCH_SIZE, versions
from dare_tf.testing.requests import DEFAULT_SIGNATURE, Limits, ServingError

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

    def signature(self, model_spec, method: str):
        if model_spec.name != self.name:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {model_spec.name}")
        if model_spec.HasField("version") and model_spec.version.value != self.version:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Servable not found: {model_spec.name} version {model_spec.version.value}")
        name = model_spec.signature_name or DEFAULT_SIGNATURE
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
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input keys {sorted(inputs)} do not match the signature's {sorted(expected)}")
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


class Batcher:
    """Merges concurrent Predict requests into one call, as TF Serving's
    `--enable_batching` does (`batching_session.cc`, `batching_util.cc`):
    every input of a request needs the same first dimension (a request that
    shares one `[1, T]` history among its targets is refused, as TF
    Serving's batching session refuses it); requests of the same signature
    are concatenated along it (up to `max_batch_size` rows, waiting at most
    `timeout_s` for more), run once, and split back along it. Inputs whose
    other dimensions differ are padded, with `pad_variable_length_inputs`,
    AFTER their elements to the batch's largest with each tensor's own first
    element (an empty tensor among non-empty ones fails the batch), or fail
    the whole batch without it; outputs come back split along the first
    dimension only, with the batch's padded sizes."""

    def __init__(self, model: LoadedModel, max_batch_size: int = MAX_BATCH_SIZE, timeout_s: float = 0.001,
                 pad_variable_length_inputs: bool = True):
        self.model, self.max_batch_size, self.timeout_s = model, max_batch_size, timeout_s
        self.pad = pad_variable_length_inputs
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True).start()

    @staticmethod
    def _key(name, inputs):
        sizes = {v.shape[0] if v.ndim else None for v in inputs.values()}
        if len(sizes) != 1 or None in sizes:
            return None  # not row-aligned
        return (name, tuple(sorted((k, v.ndim, v.dtype.str) for k, v in inputs.items())))

    def run(self, name, definition, inputs):
        key = self._key(name, inputs)
        if key is None:  # as TF Serving's batching session refuses it
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               "with batching, every input needs the same 0th-dimension size (send a history "
                               "per target, not one [1, T] history for all; or use the rank signature), or serve "
                               "without batching")
        done = futures.Future()
        self.queue.put((key, name, definition, inputs, done))
        return done.result()

    def _loop(self):
        while True:
            pending = [self.queue.get()]
            deadline = time.perf_counter() + self.timeout_s
            rows = next(iter(pending[0][3].values())).shape[0]
            while rows < self.max_batch_size:
                try:
                    item = self.queue.get(timeout=max(deadline - time.perf_counter(), 0))
                except queue.Empty:
                    break
                pending.append(item)
                rows += next(iter(item[3].values())).shape[0]
            groups: dict = {}
            for item in pending:
                groups.setdefault(item[0], []).append(item)
            for items in groups.values():
                self._run_group(items)

    def merged(self, requests: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The requests' inputs as TF Serving's batcher concatenates them (see the class)."""
        merged = {}
        for key in requests[0]:
            tensors = [r[key] for r in requests]
            widest = np.max([t.shape for t in tensors], axis=0)
            if any(tuple(t.shape[1:]) != tuple(widest[1:]) for t in tensors):
                if not self.pad:
                    raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, (
                        f"Tensors with name '{key}' from different tasks have different shapes and padding is "
                        "turned off. Set pad_variable_length_inputs to true, or ensure that all tensors with "
                        "the same name have equal dimensions starting with the first dim."))
                if any(t.size == 0 for t in tensors):
                    raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                       "Got empty tensor in batch of non-empty tensors.")
                tensors = [np.pad(t, [(0, 0)] + [(0, w - d) for w, d in zip(widest[1:], t.shape[1:])],
                                  constant_values=t.flat[0]) for t in tensors]
            merged[key] = np.concatenate(tensors)
        return merged

    def _run_group(self, items):
        _, name, definition, _, _ = items[0]
        sizes = [next(iter(it[3].values())).shape[0] for it in items]
        try:
            outputs = self.model.run(name, definition, self.merged([it[3] for it in items]))
        except Exception as e:  # noqa: BLE001 (every request of the group gets the error)
            for it in items:
                it[4].set_exception(e)
            return
        start = 0
        for it, size in zip(items, sizes):
            it[4].set_result({k: v[start: start + size] for k, v in outputs.items()})
            start += size


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
        self.batchers = ({name: Batcher(model, limits.max_batch_size,
                                        pad_variable_length_inputs=pad_variable_length_inputs)
                          for name, model in models.items()} if batching else {})

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
            batcher = self.batchers.get(model.name)
            outputs = (batcher.run if batcher else model.run)(name, definition, inputs)
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


def serve(models: dict[str, str], port: int = 0, rest_port: int | None = None, workers: int = 16,
          batching: bool = True, limits: Limits = Limits(), pad_variable_length_inputs: bool = True):
    """Starts the gRPC (and optionally REST) stand-in serving `models` (name ->
    base path holding numeric versions; `read_model_config` reads them from a
    `models.config`) within `limits`, merging concurrent requests (`batching`,
    `Batcher`); returns (grpc_server, grpc_port, http_server).

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
    http = None
    if rest_port is not None:
        from dare_tf.testing.rest import RestHandler

        handler = type("Handler", (RestHandler,), {"models": loaded, "limits": limits, "batchers": service.batchers,
                                                   "workers": threading.BoundedSemaphore(limits.rest_workers)})
        try:
            http = _HTTPServer(("localhost", rest_port), handler)
        except OSError as e:
            server.stop(0)
            raise OSError(f"REST port localhost:{rest_port}: address in use ({e.strerror})") from e
        threading.Thread(target=http.serve_forever, daemon=True).start()
    return server, bound, http
