"""dare_tf.serving.client and its program: predict, classify, regress, metadata, REST and
explain against the Keras model; retries until the server is up; raw ids in and out."""

import os
import threading

import grpc
import numpy as np
import pytest

from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.serving.client import ServingClient, make_example
from dare_tf.serving.encoding import pad_histories
from dare_tf.serving.rest import rest_predict
from dare_tf.testing.loaded_model import latest_version
from dare_tf.testing.standin_server import serve
from tests.served import L, in_process, requests
from tests.programs import run_program


@pytest.mark.xdist_group("serving_setup")
def test_client_predict_classify_regress_metadata_rest(setup, rng):
    req = requests(setup["data_dir"], rng)
    expected, explained = in_process(setup, *req)
    client = ServingClient(f"localhost:{setup['port']}", "dare")
    np.testing.assert_allclose(client.predict(*req)["probability"], expected, atol=1e-5)
    examples = [make_example(*row) for row in zip(*req)]
    scores = client.classify(examples)
    np.testing.assert_allclose(scores[:, 1], expected, atol=1e-5)
    np.testing.assert_allclose(scores.sum(1), 1.0, atol=1e-6)
    np.testing.assert_allclose(client.regress(examples), expected, atol=1e-5)
    meta = client.metadata()
    assert (meta["model"], meta["version"]) == ("dare", latest_version(os.path.dirname(setup["path"])))
    assert meta["signatures"]["serving_default"]["inputs"]["hist_items"] == "int64"
    assert meta["signatures"]["classify"]["method"] == "tensorflow/serving/classify"
    rest = rest_predict(setup["rest"], "dare", {
        "target_item": req[0], "target_category": req[1],
        "hist_items": pad_histories(req[2]), "hist_categories": pad_histories(req[3])})
    np.testing.assert_allclose(rest["probability"], expected, atol=1e-5)
    # explain: indices point into the request's own history.
    out = client.explain(*req)
    np.testing.assert_allclose(out["attention_weight"], np.asarray(explained["attention_weights"]), atol=1e-5)
    for row, history in enumerate(req[2]):
        idx = out["history_index"][row]
        real = idx[idx >= 0]
        assert len(real) == min(len(history), L, 5)
        assert real.max() < len(history) and real.min() >= max(0, len(history) - L)


@pytest.mark.xdist_group("serving_setup")
def test_client_retries_until_the_server_is_up(setup, tmp_path):
    from dare_tf.testing.ports import free_port

    port = free_port()
    started = []
    timer = threading.Timer(1.0, lambda: started.append(
        serve({"dare": os.path.dirname(setup["path"])}, port)[0]))
    timer.start()
    client = ServingClient(f"localhost:{port}", "dare", timeout=2.0, retries=6, backoff=0.25)
    try:
        assert "serving_default" in client.metadata()["signatures"]
    finally:
        timer.join()
        for server in started:
            server.stop(0).wait()  # a request that meets a stopping server is CANCELLED, not UNAVAILABLE
    with pytest.raises(grpc.RpcError) as err:
        ServingClient(f"localhost:{port}", "dare", timeout=0.5, retries=1, backoff=0.05).metadata()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.xdist_group("serving_setup")
def test_client_program_explains_in_the_requests_raw_ids(setup, tmp_path):
    import json


    items = [int(r) for r in read_id_map(setup["data_dir"], "item")]
    cats = [int(r) for r in read_id_map(setup["data_dir"], "category")]
    history = items[10:16]
    request = {"target_item": [items[3], items[4]], "target_category": [cats[1], cats[2]],
               "hist_items": [history, history], "hist_categories": [cats[:6], cats[:6]]}
    (tmp_path / "request.json").write_text(json.dumps(request))

    def client(*flags):
        done = run_program("serving.client", f"--server=localhost:{setup['port']}", "--model_name=dare",
                           "--signature=explain", f"--request_json={tmp_path / 'request.json'}", *flags)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    rows = json.loads(client("--format=json"))
    expected = ServingClient(f"localhost:{setup['port']}", "dare").explain(
        request["target_item"], request["target_category"], request["hist_items"], request["hist_categories"])
    for i, row in enumerate(rows):
        assert row["target_item"] == request["target_item"][i]
        assert row["probability"] == pytest.approx(float(expected["probability"][i]), abs=1e-6)
        weights = [b["weight"] for b in row["behaviours"]]
        assert weights == sorted(weights, reverse=True) and len(weights) == (expected["history_index"][i] >= 0).sum()
        for b in row["behaviours"]:  # raw ids of the request, and how many clicks before the target
            assert b["item"] == history[len(history) - b["clicks_ago"]]
            assert b["category"] == cats[:6][len(history) - b["clicks_ago"]]
    table = client()
    assert "| target item | category | P(click) |" in table
    # --metadata: the served model's name and version, then its signatures
    meta = json.loads(client("--metadata"))
    assert (meta["model"], meta["version"]) == ("dare", latest_version(os.path.dirname(setup["path"])))
    assert list(meta)[:2] == ["model", "version"] and "explain" in meta["signatures"]
    assert "| rank | behaviour item | category | clicks ago | weight |" in table
    # REST failures end the program in one line, as gRPC's do
    for flags, message in [((f"--rest_url={setup['rest']}", "--model_name=nope"),
                            f"error: {setup['rest']}: REST predict failed (HTTP 404): "),
                           (("--rest_url=http://127.0.0.1:1",), "error: http://127.0.0.1:1: no REST server answers")]:
        done = run_program("serving.client", "--model_name=dare", f"--request_json={tmp_path / 'request.json'}", *flags)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(message), done.stderr[-2000:]
