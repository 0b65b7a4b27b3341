"""dare_tf.testing.standin_server: ports in use are refused; oversized requests are refused
before anything is allocated."""

import os

import grpc
import numpy as np
import pytest
import tensorflow as tf

from dare_tf.testing.standin_server import serve
from tests.served import raw_maps


@pytest.mark.xdist_group("serving_setup")
def test_server_refuses_ports_in_use(setup):
    with pytest.raises(OSError, match="address in use"):
        serve({"dare": os.path.dirname(setup["path"])}, setup["port"])
    rest_port = int(setup["rest"].rsplit(":", 1)[1])
    with pytest.raises(OSError, match="REST port .*address in use"):
        serve({"dare": os.path.dirname(setup["path"])}, 0, rest_port=rest_port)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.xdist_group("serving_setup")
def test_oversized_requests_are_refused_before_anything_is_allocated(setup):
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(f"localhost:{setup['port']}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def call(inputs, protos=None):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "dare"
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        for name, proto in (protos or {}).items():
            request.inputs[name].CopyFrom(proto)
        try:
            stub.Predict(request, timeout=30)
            return grpc.StatusCode.OK, "", request.ByteSize()
        except grpc.RpcError as e:
            return e.code(), e.details(), request.ByteSize()

    items, _ = raw_maps(setup["data_dir"])
    some = np.array(list(items)[:200], np.int64)
    history = {"hist_items": some[None], "hist_categories": np.ones((1, 200), np.int64)}
    four = {"hist_items": np.repeat(some[None], 4, 0), "hist_categories": np.ones((4, 200), np.int64)}
    assert call({"target_item": some[:4], "target_category": np.ones(4, np.int64), **four})[0] == grpc.StatusCode.OK
    idle = _rss_mb()
    # 60,000 targets sharing one 200-behaviour history: under 1 MB on the wire
    many = np.resize(some, 60_000)
    code, details, size = call({"target_item": many, "target_category": np.ones(60_000, np.int64), **history})
    assert size < 1 << 20 and code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "input target_category: a batch of 60,000 rows is over the server's max_batch_size of 256; " \
                      "split the request"
    # a TensorProto of a few bytes claiming 2^26 values (TensorFlow would fill them from one)
    claim = tf.make_tensor_proto(np.int64(5))
    claim.tensor_shape.Clear()
    claim.tensor_shape.dim.add(size=1 << 26)
    code, details, size = call({"target_category": np.ones(1, np.int64), **history}, {"target_item": claim})
    assert claim.ByteSize() < 20 and code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "input target_item: shape [67108864] claims 67,108,864 values but the request carries 1"
    assert _rss_mb() - idle < 300
    channel.close()
