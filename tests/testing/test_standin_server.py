"""dare_tf.testing.standin_server: ports in use are refused; oversized requests are refused
before anything is allocated; a new version is served without a restart, and requests
in flight during the switch are answered by one version or the other."""

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


@pytest.mark.xdist_group("serving_setup")
def test_a_new_version_is_served_without_restart_and_no_request_fails_during_the_switch(setup, tmp_path):
    """Two exports of the same model name (different weights, as a continued run's
    next version): clients hammering gRPC and REST during the export see version 1,
    then version 2, each answer equal to its version's own predictions, no error."""
    import json
    import threading
    import time
    import urllib.request

    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from dare_tf import build_model
    from dare_tf.export import ranker as export_lib

    spec, data_dir, base = setup["spec"], setup["data_dir"], str(tmp_path / "exports")
    models = [build_model("dare", spec.num_items, spec.num_categories, max_len=20, top_k=5, seed=s,
                          initializer="keras") for s in (1, 2)]
    for m, scale in zip(models, (0.3, 0.6)):
        for table in m.embedding.weights:
            table.assign(np.random.default_rng(int(scale * 10)).normal(0, scale, table.shape))
    x = {"target_item": np.array([3, 4], np.int64), "target_category": np.array([1, 2], np.int64),
         "hist_items": np.array([[-3, 0, 5], [-3, 7, 9]], np.int64),
         "hist_categories": np.array([[-3, 0, 1], [-3, 2, 1]], np.int64)}
    export_lib.export_saved_model(models[0], data_dir, base, "dare")
    server, port, http = serve({"dare": os.path.join(base, "dare")}, 0, rest_port=0, poll_s=0.2)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"localhost:{port}"))
    raw_items, raw_cats = (np.array([0] + list(m)) for m in raw_maps(data_dir))
    raw = {k: np.where(v < 0, v, (raw_items if "item" in k else raw_cats)[np.maximum(v, 0)]) for k, v in x.items()}
    answers, errors, stop = [], [], threading.Event()

    def grpc_client():
        while not stop.is_set():
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "dare"
            for k, v in raw.items():
                request.inputs[k].CopyFrom(tf.make_tensor_proto(v))
            try:
                response = stub.Predict(request, timeout=30)
                answers.append((response.model_spec.version.value,
                                tuple(tf.make_ndarray(response.outputs["probability"]).round(5))))
            except grpc.RpcError as e:
                errors.append(str(e))

    def rest_client():
        body = json.dumps({"inputs": {k: v.tolist() for k, v in raw.items()}}).encode()
        while not stop.is_set():
            try:
                with urllib.request.urlopen(urllib.request.Request(
                        f"http://localhost:{http.server_address[1]}/v1/models/dare:predict", body), timeout=30) as r:
                    answers.append((None, tuple(np.round(json.load(r)["outputs"]["probability"], 5))))
            except Exception as e:  # noqa: BLE001 - any failure is what the test counts
                errors.append(str(e))

    threads = [threading.Thread(target=f) for f in (grpc_client, grpc_client, rest_client)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        export_lib.export_saved_model(models[1], data_dir, base, "dare")  # version 2, while requests run
        deadline = time.monotonic() + 60
        while not any(v == 2 for v, _ in answers) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        server.stop(0)
        http.shutdown()
    padded = {k: np.pad(np.maximum(v, 0), [(0, 0), (20 - v.shape[1], 0)]) if v.ndim == 2 else v
              for k, v in x.items()}  # (the model's dense inputs: the leading -T column is padding there)
    expected = [tuple(np.asarray(m.predict_on_batch({k: v.astype(np.int32) for k, v in padded.items()})).round(5))
                for m in models]
    assert not errors, errors[:3]
    from dare_tf.serving.client import ServingClient

    assert ServingClient(f"localhost:{setup['port']}", "dare").served_version() == 1  # (the shared export)
    assert not np.allclose(expected[0], expected[1], atol=1e-3)  # the versions tell apart
    versions = [v for v, _ in answers if v is not None]
    assert versions.count(1) > 3 and versions.count(2) > 3 and any(v is None for v, _ in answers)
    assert versions[0] == 1 and versions[-1] == 2 and versions == sorted(versions)  # one switch, never back
    for version, probability in answers:
        if version is not None:
            np.testing.assert_allclose(probability, expected[version - 1], atol=1e-4)
        else:  # REST answers carry no version: one of the two
            assert any(np.allclose(probability, e, atol=1e-4) for e in expected), probability


@pytest.mark.xdist_group("serving_setup")
def test_a_broken_version_is_skipped_and_the_watch_goes_on(setup, tmp_path, caplog):
    """Issue 45 (8): a version directory whose saved_model.pb is garbage (as a copy in
    progress looks) killed the version watch for every model: later exports were
    never served. Now it is logged, the current version serves on, and the next
    good version is served."""
    import time

    from dare_tf.export import ranker as export_lib
    from dare_tf.serving.client import ServingClient

    base = str(tmp_path / "exports")
    export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")
    server, port, _ = serve({"dare": os.path.join(base, "dare")}, 0, poll_s=0.1)
    client = ServingClient(f"localhost:{port}", "dare", retries=0)
    try:
        os.makedirs(os.path.join(base, "dare", "2"))
        with open(os.path.join(base, "dare", "2", "saved_model.pb"), "wb") as f:
            f.write(b"\x00garbage")
        deadline = time.monotonic() + 30
        while "version 2 under" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "model dare: version 2 under " in caplog.text and "did not load" in caplog.text
        assert client.served_version() == 1  # still serving
        export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")  # version 3
        while client.served_version() != 3 and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        assert client.served_version() == 3
        assert caplog.text.count("version 2 under") == 1  # logged once, not at every poll
    finally:
        client.close()
        server.stop(0)
