"""`dare_tf.serving.protos`: TF Serving's messages without TensorFlow's runtime, and
numpy arrays to and from TensorProto exactly as TensorFlow makes and reads them."""

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO

ARRAYS = {
    "int64": np.array([[1, -2, 3], [4, 5, 2**40]], np.int64), "int32": np.array([7, -8], np.int32),
    "float32": np.array([[0.5, -1.25]], np.float32), "float64": np.array([1e-300, 3.5]),
    "float16": np.array([0.5, 65504.0], np.float16), "bool": np.array([True, False, True]),
    "uint8": np.array([0, 255], np.uint8), "int16": np.array([-3], np.int16), "uint64": np.array([2**63], np.uint64),
    "strings": np.array([["a", "é"], ["", "x y"]], object), "bytes": np.array([b"\x00\xff", b"k"], object),
    "scalar": np.array(3, np.int64), "empty": np.zeros([2, 0], np.float32),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_a_tensor_proto_is_tensorflows_and_reads_back_as_tensorflow_reads_it(name):
    import tensorflow as tf

    from dare_tf.serving.protos import tensor_proto, to_array

    array = ARRAYS[name]
    ours = tensor_proto(array)
    assert ours.SerializeToString() == tf.make_tensor_proto(array).SerializeToString()
    back, theirs = to_array(ours), tf.make_ndarray(ours)
    assert back.dtype == theirs.dtype and back.shape == theirs.shape
    assert back.tolist() == theirs.tolist()


def test_values_listed_in_typed_fields_and_fewer_than_the_shape_read_as_tensorflow_reads_them():
    import tensorflow as tf

    from dare_tf.serving.protos import to_array

    for value, dtype, shape in [(2.5, tf.float32, [2, 3]), (7, tf.int64, [4]), (b"s", tf.string, [3]),
                                ([1, 2], tf.int32, [2, 2]), (True, tf.bool, [2]), (0.5, tf.float16, [3]),
                                (1.5, tf.float64, [])]:
        proto = tf.make_tensor_proto(value, dtype=dtype, shape=shape)
        if proto.tensor_content:  # (make these listed values, as a server may send them)
            proto = tf.make_tensor_proto(tf.make_ndarray(proto).reshape(-1)[:1], dtype=dtype)
            proto.tensor_shape.CopyFrom(tf.TensorShape(shape).as_proto())
        assert to_array(proto).tolist() == tf.make_ndarray(proto).tolist(), (value, dtype)
        assert to_array(proto).dtype == tf.make_ndarray(proto).dtype


def test_dtype_names_are_tensorflows():
    import tensorflow as tf

    from dare_tf.serving.protos import dtype_name

    for dtype in (tf.float16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16,
                  tf.uint32, tf.uint64, tf.bool, tf.string, tf.bfloat16, tf.complex64, tf.resource):
        assert dtype_name(dtype.as_datatype_enum) == dtype.name


def test_the_client_loads_no_tensorflow_runtime_and_tensorflow_imports_after_it_as_usual():
    """Issue 69 (7): `recommend` took ~7 s a call, most of it `import tensorflow` pulled in by the
    gRPC protos. The client now loads without TensorFlow's runtime; TensorFlow imported
    afterwards works and makes messages of the same classes."""
    code = (
        "import sys, numpy as np\n"
        "import dare_tf.serving.client as client, dare_tf.serving.recommender, dare_tf.histories\n"
        "from dare_tf.serving import protos\n"
        "from dare_tf.serving.encoding import candidates_line\n"
        "assert candidates_line({'n': 3, 'sources': {'filler': 3}}) == "
        "'the 3 candidates: 0 two_tower, 0 popularity, 0 recent_categories, 3 filler'\n"
        "assert not [m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.')], sorted(sys.modules)\n"
        "import tensorflow as tf\n"
        "assert type(tf.make_tensor_proto(np.int64(1))) is protos.tensor_pb2.TensorProto\n"
        "assert type(tf.train.Example()) is protos.example_pb2.Example\n"
        "request = protos.predict_pb2.PredictRequest()\n"
        "request.inputs['x'].CopyFrom(tf.make_tensor_proto(np.arange(3)))\n"
        "print(tf.make_ndarray(request.inputs['x']).tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[0, 1, 2]"
