"""The stand-in server's REST API (`POST /v1/models/NAME[/versions/N]:predict`), as
TensorFlow Serving answers it: 200 with `outputs` (columnar `inputs`) or
`predictions` (row `instances`), 400 for a malformed body, 404 for an unknown model
or version, 413 for a body over the server's `max_request_bytes`. Every request
gets an HTTP answer; a failure inside the server is a 500 with its message."""

from __future__ import annotations

import base64
import json
import re
from http.server import BaseHTTPRequestHandler

import grpc
import numpy as np
import tensorflow as tf

from dare_tf.testing.requests import DEFAULT_SIGNATURE, Limits, ServingError

_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+))?:predict")


class _BadRequest(Exception):
    pass


class RestHandler(BaseHTTPRequestHandler):
    models: dict  # name -> dare_tf.testing.standin_server.LoadedModel
    batchers: dict = {}  # name -> its Batcher (shared with gRPC), when batching is on
    limits: Limits = Limits()
    protocol_version = "HTTP/1.1"  # keep-alive, as TF Serving's REST server
    disable_nagle_algorithm = True  # (headers and body are two writes: no 40 ms delayed-ACK wait between them)

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, code: int, payload: dict):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        match = _PATH.fullmatch(self.path)
        if not match or match.group(1) not in self.models:
            return self._reply(404, {"error": f"Servable not found for request: {self.path}"})
        model = self.models[match.group(1)]
        if match.group(2) is not None and int(match.group(2)) != model.version:
            return self._reply(404, {"error": f"Servable not found for request: Specific({model.name}, "
                                              f"{int(match.group(2))}); serving version {model.version}"})
        try:
            length = int(self.headers.get("Content-Length", 0))
        except ValueError:
            return self._reply(400, {"error": "Content-Length is not a number"})
        if length > self.limits.max_request_bytes:
            self.close_connection = True  # the body is not read
            return self._reply(413, {"error": f"a body of {length:,} bytes is over the server's max_request_bytes "
                                              f"of {self.limits.max_request_bytes:,}"})
        try:
            return self._predict(model, self.rfile.read(length))
        except ServingError as e:
            return self._reply(400, {"error": str(e)})
        except _BadRequest as e:
            return self._reply(400, {"error": f"malformed request: {e}"})
        except Exception as e:  # noqa: BLE001  (an answer for every request, never a dropped connection)
            return self._reply(500, {"error": f"{type(e).__name__}: {e}"})

    def _predict(self, model, raw: bytes):
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _BadRequest(f"the body is not JSON ({type(e).__name__})") from None
        if not isinstance(body, dict):
            raise _BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
        name = body.get("signature_name", DEFAULT_SIGNATURE)
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
        batcher = self.batchers.get(model.name)
        outputs = {k: _json_value(k, v) for k, v in (batcher.run if batcher else model.run)(name, definition,
                                                                                            feed).items()}
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
    JSON integers in the int64 range (1.5, true or 2**70 are refused, not truncated)."""
    if dtype.is_integer:
        flat = value if isinstance(value, list) else [value]
        while flat and isinstance(flat[0], list):
            flat = [x for row in flat for x in (row if isinstance(row, list) else [row])]
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
