"""TF Serving's request and response messages without loading TensorFlow: the
official generated modules of tensorflow-serving-api and of the TensorFlow protos
they use, loaded here without running `tensorflow/__init__` (which loads the whole
runtime, ~4-7 s), and numpy arrays to and from `TensorProto` as
`tf.make_tensor_proto` and `tf.make_ndarray` make and read them.

The messages are the official ones (the same descriptors in protobuf's default
pool, so a `TensorProto` or `Example` TensorFlow makes later in the process is of
the same class): while the modules load, `tensorflow` is a bare package whose
path is TensorFlow's own; the `tensorflow.*` modules imported then are dropped
from `sys.modules` afterwards, so a later `import tensorflow` runs as usual.
Where TensorFlow is imported already they are imported the usual way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import numpy as np

_MODULES = {
    "predict_pb2": "tensorflow_serving.apis.predict_pb2",
    "classification_pb2": "tensorflow_serving.apis.classification_pb2",
    "regression_pb2": "tensorflow_serving.apis.regression_pb2",
    "get_model_metadata_pb2": "tensorflow_serving.apis.get_model_metadata_pb2",
    "prediction_service_pb2_grpc": "tensorflow_serving.apis.prediction_service_pb2_grpc",
    "example_pb2": "tensorflow.core.example.example_pb2",
    "feature_pb2": "tensorflow.core.example.feature_pb2",
    "tensor_pb2": "tensorflow.core.framework.tensor_pb2",
    "types_pb2": "tensorflow.core.framework.types_pb2",
}


def _load() -> dict[str, types.ModuleType]:
    if "tensorflow" in sys.modules:
        return {name: importlib.import_module(module) for name, module in _MODULES.items()}
    spec = importlib.util.find_spec("tensorflow")
    if spec is None:
        raise ImportError("the gRPC client needs tensorflow-serving-api and TensorFlow's protos: "
                          "pip install dare-tf[tensorflow]")
    before = set(sys.modules)
    bare = types.ModuleType("tensorflow")
    bare.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = bare
    try:
        return {name: importlib.import_module(module) for name, module in _MODULES.items()}
    finally:
        for name in set(sys.modules) - before:
            if name == "tensorflow" or name.startswith("tensorflow."):
                del sys.modules[name]


_LOADED = _load()
predict_pb2, classification_pb2 = _LOADED["predict_pb2"], _LOADED["classification_pb2"]
regression_pb2, get_model_metadata_pb2 = _LOADED["regression_pb2"], _LOADED["get_model_metadata_pb2"]
prediction_service_pb2_grpc = _LOADED["prediction_service_pb2_grpc"]
example_pb2, feature_pb2 = _LOADED["example_pb2"], _LOADED["feature_pb2"]
tensor_pb2, types_pb2 = _LOADED["tensor_pb2"], _LOADED["types_pb2"]

# numpy dtype <-> TensorProto dtype, and the TensorProto field that lists values of that type
# where tensor_content is not used (as tensor_util.make_ndarray reads them).
_DTYPES = {
    np.dtype(np.float16): ("DT_HALF", "half_val"), np.dtype(np.float32): ("DT_FLOAT", "float_val"),
    np.dtype(np.float64): ("DT_DOUBLE", "double_val"), np.dtype(np.int8): ("DT_INT8", "int_val"),
    np.dtype(np.int16): ("DT_INT16", "int_val"), np.dtype(np.int32): ("DT_INT32", "int_val"),
    np.dtype(np.int64): ("DT_INT64", "int64_val"), np.dtype(np.uint8): ("DT_UINT8", "int_val"),
    np.dtype(np.uint16): ("DT_UINT16", "int_val"), np.dtype(np.uint32): ("DT_UINT32", "uint32_val"),
    np.dtype(np.uint64): ("DT_UINT64", "uint64_val"), np.dtype(np.bool_): ("DT_BOOL", "bool_val"),
}
_BY_ENUM = {types_pb2.DataType.Value(name): (dtype, field) for dtype, (name, field) in _DTYPES.items()}
_DT_STRING = types_pb2.DT_STRING
# tf.dtypes names that differ from the enum's name, lower-cased without DT_.
_NAMES = {"half": "float16", "float": "float32", "double": "float64"}


def dtype_name(enum: int) -> str:
    """A TensorProto dtype's name as `tf.dtypes.as_dtype(enum).name` says it
    (`DT_FLOAT`: float32, `DT_STRING`: string)."""
    name = types_pb2.DataType.Name(enum)[3:].lower()
    return _NAMES.get(name, name)


def tensor_proto(value) -> tensor_pb2.TensorProto:
    """`value` (a numpy array, or what `np.asarray` takes) as the TensorProto
    `tf.make_tensor_proto` makes of the same array: numbers as `tensor_content`
    where there are two or more (booleans and uint16 always listed), strings
    (bytes, or str as UTF-8) as `string_val`."""
    array = np.asarray(value)
    proto = tensor_pb2.TensorProto()
    proto.tensor_shape.SetInParent()  # (a scalar's empty shape, set, as TensorFlow sets it)
    for n in array.shape:
        proto.tensor_shape.dim.add(size=n)
    flat = array.reshape(-1)
    if array.dtype.kind in "OSU":
        proto.dtype = _DT_STRING
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
        return proto
    if array.dtype not in _DTYPES:
        raise TypeError(f"no TensorProto dtype for numpy's {array.dtype}")
    name, field = _DTYPES[array.dtype]
    proto.dtype = types_pb2.DataType.Value(name)
    if array.size > 1 and array.dtype.kind != "b" and array.dtype != np.uint16:
        proto.tensor_content = np.ascontiguousarray(flat).astype(array.dtype.newbyteorder("<")).tobytes()
    else:
        getattr(proto, field).extend((flat.view(np.uint16) if field == "half_val" else flat).tolist())
    return proto


def to_array(proto) -> np.ndarray:
    """A TensorProto as the numpy array `tf.make_ndarray` reads from it (strings:
    an object array of bytes; values given fewer than the shape holds repeat the
    last, as TensorFlow fills them)."""
    shape = [d.size for d in proto.tensor_shape.dim]
    size = int(np.prod(shape, dtype=np.int64))
    if proto.dtype == _DT_STRING:
        values = np.array(list(proto.string_val), object)
    else:
        if proto.dtype not in _BY_ENUM:
            raise TypeError(f"no numpy dtype for the TensorProto dtype {types_pb2.DataType.Name(proto.dtype)}")
        dtype, field = _BY_ENUM[proto.dtype]
        if proto.tensor_content:
            return np.frombuffer(proto.tensor_content, dtype.newbyteorder("<")).astype(dtype).reshape(shape)
        listed = list(getattr(proto, field))
        values = (np.array(listed, np.uint16).view(np.float16) if field == "half_val"
                  else np.array(listed, dtype))
    if values.size == size:
        return values.reshape(shape)
    if values.size == 0:
        return np.zeros(shape, values.dtype if proto.dtype != _DT_STRING else object)
    return np.concatenate([values, np.repeat(values[-1:], size - values.size)]).reshape(shape)
