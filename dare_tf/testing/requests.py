"""What the stand-in server checks of a request before running it: `Limits` (batch
size, request bytes, claimed tensor sizes) and `ServingError`, the gRPC status a
refused request gets (shared by the gRPC service and the REST handler)."""

from __future__ import annotations

import dataclasses
import math

import grpc
import tensorflow as tf

from dare_tf.signatures import MAX_BATCH_SIZE

# The TensorProto field that carries each dtype's values when tensor_content is empty.
_VALUE_FIELDS = {tf.int64: "int64_val", tf.int32: "int_val", tf.int16: "int_val", tf.int8: "int_val",
                 tf.uint8: "int_val", tf.float32: "float_val", tf.float64: "double_val", tf.string: "string_val",
                 tf.bool: "bool_val", tf.float16: "half_val"}


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask of the server, checked before anything is
    allocated for it. TF Serving bounds the same: its batching parameters'
    `max_batch_size` and gRPC's receive-message limit. The default batch limit is
    the exported batching parameters' (`dare_tf.signatures.MAX_BATCH_SIZE`).

    Attributes:
        max_batch_size: rows (the first dimension of any input) of one request,
            and of a batch the batcher merges.
        max_request_bytes: bytes of one gRPC message or REST body.
        rest_workers: REST requests read and run at once (TF Serving: its REST
            thread pool); each holds its body and the parsed JSON (several
            times the body), so this bounds REST's memory.
        request_timeout_s: how long a REST request waits for a worker, and a
            connection for the rest of its request, before it is refused.
    """

    max_batch_size: int = MAX_BATCH_SIZE
    max_request_bytes: int = 64 << 20
    rest_workers: int = 4
    request_timeout_s: float = 30.0

    def check_tensor(self, name: str, proto) -> None:
        """Refuses a TensorProto whose shape claims more values than it carries
        (TensorFlow would fill the claimed shape from one value) or whose batch
        is over `max_batch_size`."""
        try:
            dtype = tf.dtypes.as_dtype(proto.dtype)
        except TypeError as e:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"input {name}: {e}") from e
        dims = [d.size for d in proto.tensor_shape.dim]
        if any(d < 0 for d in dims) or dtype not in _VALUE_FIELDS:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {name}: a {dtype.name} tensor of shape {dims} is not servable here")
        claimed = math.prod(dims)
        carried = (len(proto.tensor_content) / dtype.size if proto.tensor_content
                   else len(getattr(proto, _VALUE_FIELDS[dtype])))
        if carried != claimed:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {name}: shape {dims} claims {claimed:,} values but the request carries "
                               f"{carried:,.0f}")
        self.check_batch(name, dims)

    def check_batch(self, name: str, shape) -> None:
        if len(shape) and shape[0] > self.max_batch_size:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {name}: a batch of {shape[0]:,} rows is over the server's max_batch_size "
                               f"of {self.max_batch_size:,}; split the request")


class ServingError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
