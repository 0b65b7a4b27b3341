"""The stand-in server's REST API (`POST /v1/models/NAME[/versions/N]:predict`), as
TensorFlow Serving answers it: 200 with `outputs` (columnar `inputs`) or
`predictions` (row `instances`), 400 for a malformed body, 404 for an unknown model
or version, 413 for a body over the server's `max_request_bytes`, 503 when no REST
worker frees up within the request timeout; `GET /v1/models/NAME[/versions/N]` is
the model's status. Every request gets a JSON answer; a failure inside the server is
a 500 with its message.

A request's body is always consumed before its answer (or the connection is
closed), so bytes of one request are never read as the next request on a
kept-alive connection; bodies of unknown length (chunked) are refused with the
connection closed. At most `Limits.rest_workers` requests hold their bodies at
once, which bounds REST's memory as TF Serving's fixed REST thread pool does."""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler

import grpc
import numpy as np
import tensorflow as tf

from dare_tf.signatures import SERVING_DEFAULT
from dare_tf.testing.requests import Limits, ServingError

_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+))?:predict")
_STATUS_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+))?")


class _BadRequest(Exception):
    pass


class RestHandler(BaseHTTPRequestHandler):
    models: dict  # name -> dare_tf.testing.loaded_model.LoadedModel
    limits: Limits = Limits()
    workers: threading.BoundedSemaphore  # Limits.rest_workers, set by `serve`
    protocol_version = "HTTP/1.1"  # keep-alive, as TF Serving's REST server
    disable_nagle_algorithm = True  # (headers and body are two writes: no 40 ms delayed-ACK wait between them)

    def setup(self):
        self.timeout = self.limits.request_timeout_s  # a client that stops sending is dropped
        super().setup()

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, code: int, payload: dict):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line, an unsupported
        method) as JSON, the connection closed."""
        self.close_connection = True
        self._reply(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def _body_length(self) -> int | None:
        """The body's length, or None after answering a request whose body cannot be
        consumed safely (the connection is then closed, its bytes never read as a
        request)."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._reply(411, {"error": "a body needs a Content-Length (chunked bodies are not taken)"})
            return None
        lengths = self.headers.get_all("Content-Length") or []
        if len({v.strip() for v in lengths}) > 1:
            self.close_connection = True  # (RFC 9112 6.3: which body is meant cannot be told)
            self._reply(400, {"error": f"Content-Length is given more than once, differently ({', '.join(lengths)})"})
            return None
        text = lengths[0].strip() if lengths else "0"
        if not text.isdigit():
            self.close_connection = True
            self._reply(400, {"error": "Content-Length is not a non-negative number"})
            return None
        length = int(text)
        if length > self.limits.max_request_bytes:
            self.close_connection = True  # the body is not read
            self._reply(413, {"error": f"a body of {length:,} bytes is over the server's max_request_bytes "
                                       f"of {self.limits.max_request_bytes:,}"})
            return None
        return length

    def _model(self, pattern) -> tuple | None:
        """The model and path match a request names, or None after a 404."""
        match = pattern.fullmatch(self.path)
        if not match or match.group(1) not in self.models:
            self._reply(404, {"error": f"Servable not found for request: {self.path}"})
            return None
        model = self.models[match.group(1)]
        if match.group(2) is not None and int(match.group(2)) != model.version:
            self._reply(404, {"error": f"Servable not found for request: Specific({model.name}, "
                                       f"{int(match.group(2))}); serving version {model.version}"})
            return None
        return model

    def do_GET(self):
        """TF Serving's model status: `GET /v1/models/NAME[/versions/N]`."""
        length = self._body_length()
        if length is None:
            return
        self.rfile.read(length)  # (a GET's body, if any, is consumed)
        model = self._model(_STATUS_PATH)
        if model is not None:
            self._reply(200, {"model_version_status": [{"version": str(model.version), "state": "AVAILABLE",
                                                        "status": {"error_code": "OK", "error_message": ""}}]})

    def do_POST(self):
        length = self._body_length()
        if length is None:
            return
        if not self.workers.acquire(timeout=self.limits.request_timeout_s):
            self.close_connection = True  # (the body is not read)
            return self._reply(503, {"error": f"no REST worker free within {self.limits.request_timeout_s:g} s "
                                              f"({self.limits.rest_workers} at once); retry later"})
        try:
            raw = self.rfile.read(length)  # consumed before any answer
            model = self._model(_PATH)
            if model is None:
                return
            return self._predict(model, raw)
        except ServingError as e:
            return self._reply(400, {"error": str(e)})
        except _BadRequest as e:
            return self._reply(400, {"error": f"malformed request: {e}"})
        except Exception as e:  # noqa: BLE001  (an answer for every request, never a dropped connection)
            return self._reply(500, {"error": f"{type(e).__name__}: {e}"})
        finally:
            self.workers.release()

    def _predict(self, model, raw: bytes):
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _BadRequest(f"the body is not JSON ({type(e).__name__})") from None
        if not isinstance(body, dict):
            raise _BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
        name = body.get("signature_name", SERVING_DEFAULT)
        definition = model.signature_defs.get(name) if isinstance(name, str) else None
        if definition is None:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"Serving signature key \"{name}\" not found.")
        expected = sorted(definition.inputs)
        if "inputs" in body:  # columnar format
            columns, rows = body["inputs"], False
            if not isinstance(columns, dict):
                if len(expected) != 1:
                    raise _BadRequest(f"'inputs' must be an object naming each input of {name!r}: {expected}")
                columns = {expected[0]: columns}
        elif "instances" in body:  # row format
            instances, rows = body["instances"], True
            if not isinstance(instances, list) or not instances:
                raise _BadRequest("'instances' must be a non-empty list")
            if all(isinstance(i, dict) for i in instances):
                columns = {k: [i.get(k) for i in instances] for k in instances[0]}
            elif len(expected) == 1:
                columns = {expected[0]: instances}
            else:
                raise _BadRequest(f"each instance must be an object naming the inputs of {name!r}: {expected}")
        else:
            raise _BadRequest("body needs 'inputs' or 'instances'")
        unknown = sorted(set(columns) - set(expected))
        if unknown:
            raise _BadRequest(f"unknown inputs {unknown}; {name!r} takes {expected}")
        feed = {k: rest_array(k, v, tf.dtypes.as_dtype(definition.inputs[k].dtype)) for k, v in columns.items()}
        for key, value in feed.items():
            self.limits.check_batch(key, value.shape)
        run = model.batcher.run if model.batcher else model.run  # (its batcher is shared with gRPC)
        outputs = {k: _json_value(k, v) for k, v in run(name, definition, feed).items()}
        if rows:
            n = len(next(iter(outputs.values())))
            return self._reply(200, {"predictions": [{k: v[i] for k, v in outputs.items()} for i in range(n)]})
        return self._reply(200, {"outputs": outputs})


def _json_value(name: str, array: np.ndarray):
    """An output as TF Serving's REST API writes it: numbers as they are, strings
    as JSON strings, and the strings of an output whose name ends in `_bytes` as
    `{"b64": base64}`."""
    if array.dtype == object:
        encode = ((lambda b: {"b64": base64.b64encode(b).decode()}) if name.endswith("_bytes")
                  else (lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else b))
        return np.vectorize(encode, otypes=[object])(array).tolist()
    return array.tolist()


def rest_array(name: str, value, dtype: tf.DType) -> np.ndarray:
    """A JSON value as an array of the signature's dtype; integer inputs take only
    JSON integers in the int64 range (1.5, true or 2**70 are refused, not truncated),
    string inputs only JSON strings (a number or null to a model of string ids is the
    caller's 400, as TF Serving refuses it, not a failure of the server)."""
    if dtype == tf.string or dtype.is_integer:
        flat = value if isinstance(value, list) else [value]
        while flat and isinstance(flat[0], list):
            flat = [x for row in flat for x in (row if isinstance(row, list) else [row])]
    if dtype == tf.string:
        for x in flat:
            if not isinstance(x, str):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input {name}: {json.dumps(x)} is not a string id (this model takes string ids)")
    if dtype.is_integer:
        low, high = dtype.min, dtype.max  # (read once: each read costs microseconds)
        for x in flat:
            if isinstance(x, bool) or not isinstance(x, int):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input {name}: {x!r} is not an integer id")
            if not low <= x <= high:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input {name}: {x} is outside the {dtype.name} range")
    try:
        return np.array(value, dtype=dtype.as_numpy_dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"input {name}: {e}") from e
