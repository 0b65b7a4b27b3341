import os
import re
import shutil
import subprocess
import sys
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf

from dare_tf import build_model
from dare_tf.export import ranker as export_lib
from dare_tf.data.spec import DatasetSpec, read_id_map
from dare_tf.data.protocol import Protocol, prepare
from dare_tf.serving.client import ServingClient, make_example, pad_histories, rest_predict
from dare_tf.testing.standin_server import serve

from tests.conftest import SHARED_DATA

L = 20


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    data_dir = str(root / "data")
    prepare("taobao", os.path.join(SHARED_DATA, "taobao", "UserBehavior_sample.csv"), data_dir,
            Protocol(max_len=L))
    spec = DatasetSpec.load(data_dir)
    model = build_model("dare", spec.num_items, spec.num_categories, max_len=L, top_k=5,
                        initializer="keras", seed=3)
    rng = np.random.default_rng(0)
    for table in model.embedding.weights:  # spread embeddings: predictions differ per request
        table.assign(rng.normal(0, 0.5, table.shape))
    path = export_lib.export_saved_model(model, data_dir, str(root / "exports"), "dare")
    server, port, http = serve({"dare": str(root / "exports" / "dare")}, 0, rest_port=0)
    yield dict(root=root, data_dir=data_dir, spec=spec, model=model, path=path, port=port,
               rest=f"http://localhost:{http.server_address[1]}")
    server.stop(0)
    http.shutdown()


def raw_maps(data_dir):
    items = {int(r): i + 1 for i, r in enumerate(read_id_map(data_dir, "item"))}
    cats = {int(r): i + 1 for i, r in enumerate(read_id_map(data_dir, "category"))}
    return items, cats


def requests(data_dir, rng, n=12):
    """Raw-id requests with histories of 1, < L, = L and > L behaviours, and unknown ids."""
    items = [int(r) for r in read_id_map(data_dir, "item")]
    cats = [int(r) for r in read_id_map(data_dir, "category")]
    lengths = [1, 5, L, L + 13] * (n // 4)
    hist_items = [list(rng.choice(items, k)) for k in lengths]
    hist_cats = [list(rng.choice(cats, k)) for k in lengths]
    hist_items[1][0] = 987654321987  # unknown history item -> OOV row
    return (np.array(rng.choice(items, n)), np.array(rng.choice(cats, n)), hist_items, hist_cats)


def in_process(setup, target_items, target_cats, hist_items, hist_cats):
    """The Keras model on the same requests, raw ids mapped in numpy."""
    items, cats = raw_maps(setup["data_dir"])
    spec = setup["spec"]
    def dense_hist(histories, table, oov):
        out = np.zeros((len(histories), L), np.int64)
        for r, h in enumerate(histories):
            h = [table.get(x, oov) if x > 0 else 0 for x in h][-L:]
            out[r, L - len(h):] = h
        return out
    x = {"target_item": np.array([items.get(i, spec.oov_item) for i in target_items]),
         "target_category": np.array([cats.get(c, spec.oov_category) for c in target_cats]),
         "hist_items": dense_hist(hist_items, items, spec.oov_item),
         "hist_categories": dense_hist(hist_cats, cats, spec.oov_category)}
    return np.asarray(setup["model"](x)), setup["model"].explain(x)


@pytest.mark.xdist_group("serving_setup")
def test_exported_predictions_equal_keras_model(setup, rng):
    req = requests(setup["data_dir"], rng)
    expected, _ = in_process(setup, *req)
    assert expected.std() > 1e-3
    loaded = tf.saved_model.load(setup["path"])
    got = loaded.signatures["serving_default"](
        target_item=tf.constant(req[0], tf.int64), target_category=tf.constant(req[1], tf.int64),
        hist_items=tf.constant(pad_histories(req[2])), hist_categories=tf.constant(pad_histories(req[3])))
    np.testing.assert_allclose(got["probability"].numpy(), expected, atol=1e-5)


@pytest.mark.xdist_group("serving_setup")
def test_saved_model_cli_lists_signatures_and_methods(setup):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    out = subprocess.run([cli, "show", "--dir", setup["path"], "--all"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout
    for name, method in [("serving_default", "predict"), ("explain", "predict"),
                         ("classify", "classify"), ("regress", "regress")]:
        block = out.split(f"signature_def['{name}']:")[1].split("signature_def[")[0]
        assert f"Method name is: tensorflow/serving/{method}" in block, block
        if method == "predict":
            for key in ("target_item", "target_category", "hist_items", "hist_categories"):
                assert f"inputs['{key}'] tensor_info:\n        dtype: DT_INT64" in block
        else:
            assert "inputs['inputs'] tensor_info:\n        dtype: DT_STRING" in block
    assert os.path.exists(os.path.join(setup["path"], "assets.extra", "tf_serving_warmup_requests"))
    base = os.path.dirname(os.path.dirname(setup["path"]))
    assert "base_path: '/models/dare'" in open(os.path.join(base, "models.config")).read()
    assert "max_batch_size" in open(os.path.join(base, "batching_parameters.txt")).read()


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
    assert meta["serving_default"]["inputs"]["hist_items"] == "int64"
    assert meta["classify"]["method"] == "tensorflow/serving/classify"
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
def test_bad_inputs_give_defined_results_or_invalid_argument(setup):
    client = ServingClient(f"localhost:{setup['port']}", "dare", retries=0)
    good = {"target_item": np.array([1, 2], np.int64), "target_category": np.array([1, 2], np.int64),
            "hist_items": np.array([[0, 5], [7, -3]], np.int64),
            "hist_categories": np.array([[0, 5], [7, 1]], np.int64)}
    # Unknown and negative ids are defined: OOV rows, padding in histories.
    neg = dict(good, target_item=np.array([-1, 10**15], np.int64))
    assert np.all(np.isfinite(client.predict_tensors(neg)["probability"]))
    # One history ([1, T]) is shared by every target: the same as repeating it (the export, in
    # process); a batching server refuses it, as TF Serving's batching session does.
    from dare_tf.serving.cascade import LocalModel

    shared = dict(good, hist_items=good["hist_items"][1:], hist_categories=good["hist_categories"][1:])
    repeated = dict(good, hist_items=good["hist_items"][[1, 1]], hist_categories=good["hist_categories"][[1, 1]])
    local = LocalModel(os.path.dirname(setup["path"]))
    np.testing.assert_allclose(local.predict_tensors(shared)["probability"],
                               client.predict_tensors(repeated)["probability"], atol=1e-6)
    with pytest.raises(grpc.RpcError) as err:
        client.predict_tensors(shared)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("with batching, every input needs the same 0th-dimension size")
    import tensorflow as tf

    for inputs, message in [
            (dict(good, hist_items=np.zeros((3, 2), np.int64), hist_categories=np.zeros((3, 2), np.int64)),
             "hist_items must have the batch size of target_item, or 1"),
            (dict(good, target_category=np.array([1], np.int64)), "batch sizes differ")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):  # the export's own checks
            local.predict_tensors(inputs)
    cases = [
        (dict(good, hist_items=np.zeros((3, 2), np.int64), hist_categories=np.zeros((3, 2), np.int64)),
         "every input needs the same 0th-dimension size"),  # (without batching: the export's own message)
        (dict(good, hist_items=good["hist_items"].astype(np.int32)), "Expects arg\\[hist_items\\] to be int64"),
        (dict(good, target_category=np.array([1], np.int64)), "every input needs the same 0th-dimension size"),
        (dict(good, hist_categories=np.array([[1, 2, 3], [1, 2, 3]], np.int64)), "shapes differ"),
        ({k: v for k, v in good.items() if k != "hist_items"}, "do not match the signature"),
    ]
    for inputs, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            client.predict_tensors(inputs)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() and __import__("re").search(message, err.value.details()), err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        ServingClient(f"localhost:{setup['port']}", "nope", retries=0).predict_tensors(good)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # Still serving.
    assert client.predict_tensors(good)["probability"].shape == (2,)


@pytest.mark.xdist_group("serving_setup")
def test_client_retries_until_the_server_is_up(setup, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    started = []
    timer = threading.Timer(1.0, lambda: started.append(
        serve({"dare": os.path.dirname(setup["path"])}, port)[0]))
    timer.start()
    client = ServingClient(f"localhost:{port}", "dare", timeout=2.0, retries=6, backoff=0.25)
    try:
        assert "serving_default" in client.metadata()
    finally:
        timer.join()
        for server in started:
            server.stop(0)
    with pytest.raises(grpc.RpcError) as err:
        ServingClient(f"localhost:{port}", "dare", timeout=0.5, retries=1, backoff=0.05).metadata()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.xdist_group("serving_setup")
def test_failed_export_leaves_no_partial_version(setup, monkeypatch):
    base = str(setup["root"] / "failing")
    def boom(*args, **kwargs):
        raise RuntimeError("disk full")
    monkeypatch.setattr(export_lib, "warmup_requests", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")
    assert os.listdir(os.path.join(base, "dare")) == [".dare_tf_export"]  # no version, no staging
    monkeypatch.undo()
    path = export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")
    assert os.path.basename(path) == "1"
    assert os.path.basename(export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")) == "2"
    with pytest.raises(FileExistsError, match="immutable"):
        export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare", version=2)
    shutil.rmtree(base)


# -- issue 10: clear serving messages and no shared ports ------------------------------------

@pytest.mark.xdist_group("serving_setup")
def test_wrong_rank_requests_name_the_input_and_shape(setup):
    client = ServingClient(f"localhost:{setup['port']}", "dare", retries=0)
    good = {"target_item": np.array([1, 2], np.int64), "target_category": np.array([1, 2], np.int64),
            "hist_items": np.array([[0, 5], [7, 3]], np.int64), "hist_categories": np.array([[0, 5], [7, 1]], np.int64)}
    cases = [
        (dict(good, hist_items=np.array([5, 7], np.int64)),
         r"input hist_items must have shape \[batch, history_length\]"),
        (dict(good, target_item=np.array([[1], [2]], np.int64)), r"input target_item must have shape \[batch\]"),
        (dict(good, hist_categories=np.zeros((2, 2, 1), np.int64)), r"input hist_categories must have shape"),
    ]
    for inputs, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            client.predict_tensors(inputs)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert __import__("re").search(message, err.value.details()), err.value.details()
    assert client.predict_tensors(good)["probability"].shape == (2,)


@pytest.mark.xdist_group("serving_setup")
def test_classify_and_regress_with_zero_examples_give_empty_results(setup):
    client = ServingClient(f"localhost:{setup['port']}", "dare", retries=0)
    assert client.classify([]).shape == (0,)
    assert client.regress([]).shape == (0,)


@pytest.mark.xdist_group("serving_setup")
def test_non_integer_and_out_of_range_ids_are_refused(setup):
    import json
    import urllib.request

    client = ServingClient(f"localhost:{setup['port']}", "dare", retries=0)
    with pytest.raises(ValueError, match=r"target_item: ids must be integers, got 1.5"):
        client.predict([1.5], [1], [[3]], [[1]])
    with pytest.raises(ValueError, match=r"hist_items\[0\]: ids must be integers"):
        client.predict([1], [1], [[3, 2.5]], [[1, 1]])
    with pytest.raises(ValueError, match="ids must be integers"):
        make_example(1, 2, [True], [1])

    def rest(inputs):
        body = json.dumps({"inputs": inputs}).encode()
        request = urllib.request.Request(f"{setup['rest']}/v1/models/dare:predict", data=body)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    good = {"target_item": [1], "target_category": [1], "hist_items": [[3]], "hist_categories": [[1]]}
    assert rest(good)[0] == 200
    code, body = rest(dict(good, target_item=[1.5]))
    assert code == 400 and "1.5 is not an integer id" in body["error"]
    code, body = rest(dict(good, hist_items=[[2 ** 70]]))
    assert code == 400 and "outside the int64 range" in body["error"]
    assert rest(good)[0] == 200  # the handler lives on


@pytest.mark.xdist_group("serving_setup")
def test_server_refuses_ports_in_use(setup):
    with pytest.raises(OSError, match="address in use"):
        serve({"dare": os.path.dirname(setup["path"])}, setup["port"])
    rest_port = int(setup["rest"].rsplit(":", 1)[1])
    with pytest.raises(OSError, match="REST port .*address in use"):
        serve({"dare": os.path.dirname(setup["path"])}, 0, rest_port=rest_port)


@pytest.mark.xdist_group("serving_setup")
def test_stale_export_staging_of_a_dead_process_is_removed(setup, tmp_path):
    base = tmp_path / "exports"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = base / "dare" / f".version.tmp-{dead}-0123abcd"
    stale.mkdir(parents=True)
    (stale / "saved_model.pb").write_bytes(b"x")
    export_lib.export_saved_model(setup["model"], setup["data_dir"], str(base), "dare")
    assert sorted(os.listdir(base / "dare")) == [".dare_tf_export", "1"]


@pytest.mark.xdist_group("serving_setup")
@pytest.mark.parametrize("preset", ["eta", "sdim", "twin_v2"])
def test_remaining_baselines_export_with_explain(setup, rng, tmp_path, preset):
    """ETA, SDIM and TWIN-V2 export with the same signatures; `explain` maps the
    retrieved behaviours back to the request's history (SDIM: every matched
    behaviour, and its matches per hash function)."""
    spec = setup["spec"]
    model = build_model(preset, spec.num_items, spec.num_categories, max_len=L, top_k=5, initializer="keras",
                        seed=3)
    for table in model.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    path = export_lib.export_saved_model(model, setup["data_dir"], str(tmp_path / "exports"), preset)
    loaded = tf.saved_model.load(path)
    req = requests(setup["data_dir"], rng)
    inputs = dict(target_item=tf.constant(req[0], tf.int64), target_category=tf.constant(req[1], tf.int64),
                  hist_items=tf.constant(pad_histories(req[2])), hist_categories=tf.constant(pad_histories(req[3])))
    setup_model = dict(setup, model=model)
    expected, explained = in_process(setup_model, *req)
    np.testing.assert_allclose(loaded.signatures["serving_default"](**inputs)["probability"].numpy(), expected,
                               atol=1e-5)
    out = loaded.signatures["explain"](**inputs)
    index, weight = out["history_index"].numpy(), out["attention_weight"].numpy()
    sent = pad_histories(req[2])
    assert ((index >= 0) == (weight > 0)).all()
    # Every retrieved behaviour is a real behaviour of the request's history row.
    rows, cols = np.nonzero(index >= 0)
    assert len(rows) and (sent[rows, index[rows, cols]] > 0).all()
    np.testing.assert_allclose(weight, explained["attention_weights"].numpy(), atol=1e-5)
    if preset == "sdim":
        matches = out["hash_matches"].numpy()
        assert matches.shape == (len(req[0]), L, model.model_config.num_hashes)
        np.testing.assert_allclose(matches.mean(-1), weight, atol=1e-6)
    else:
        assert "hash_matches" not in out


def test_model_config_lists_every_export_and_the_stand_in_reads_it(tmp_path):
    from dare_tf.export import write_server_configs
    from dare_tf.testing.standin_server import read_model_config

    from dare_tf.export.tf_serving import model_base

    for name in ("dare", "retrieval"):
        os.makedirs(os.path.join(model_base(str(tmp_path), name), "1"))
    os.makedirs(tmp_path / "notes")  # no numeric version: not a model
    os.makedirs(tmp_path / "photos" / "2023")  # numbered, but not exported by us: not a model
    write_server_configs(str(tmp_path))
    assert read_model_config(str(tmp_path / "models.config")) == {
        "dare": str(tmp_path / "dare"), "retrieval": str(tmp_path / "retrieval")}
    escaping = tmp_path / "escaping.config"
    escaping.write_text("model_config_list { config { name: 'x' base_path: '/models/../../etc' } }")
    with pytest.raises(ValueError, match="escaping.config: model 'x': base_path '/models/../../etc' leaves the "
                                         "mounted directory"):
        read_model_config(str(escaping))
    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }")
    with pytest.raises(ValueError, match="bad.config: model 'a' is listed twice"):
        read_model_config(str(bad))
    bad.write_text("model_config_list { nonsense: 1 }")
    with pytest.raises(ValueError, match="bad.config: not a TF Serving model config"):
        read_model_config(str(bad))
    bad.write_text("")
    with pytest.raises(ValueError, match="bad.config: lists no model"):
        read_model_config(str(bad))


def test_export_names_stay_inside_the_export_base_and_a_users_models_config_is_merged(tmp_path):
    from dare_tf.export import write_server_configs
    from dare_tf.export.tf_serving import model_base
    from dare_tf.testing.standin_server import read_model_config

    base = tmp_path / "exports"
    for bad in ("../escaped", "a'b", "", ".", "..", "a/b", ".hidden", "dare\n"):
        with pytest.raises(ValueError, match=f"^model_name={re.escape(repr(bad))}: a model name is letters, "):
            model_base(str(base), bad)
    assert not (tmp_path / "escaped").exists()
    os.makedirs(base / "theirs" / "7")
    users = ("# the team's models (our old model_config_list { ... } moved to a.config)\nmodel_config_list {\n"
             "  config {\n    name: 'theirs'  # was: } in model_config_list {\n"
             "    base_path: '/models/theirs'\n    model_platform: 'tensorflow'\n"
             "    model_version_policy { specific { versions: 7 } }\n  }\n}\n")
    (base / "models.config").write_text(users)
    (base / "batching_parameters.txt").write_text("max_batch_size { value: 32 }\n")
    os.makedirs(os.path.join(model_base(str(base), "dare"), "1"))
    write_server_configs(str(base))
    merged = (base / "models.config").read_text()
    assert merged.startswith(users[:users.rindex("}")]) and merged.endswith("}\n")  # theirs kept byte for byte
    assert read_model_config(str(base / "models.config")) == {"theirs": str(base / "theirs"),
                                                              "dare": str(base / "dare")}
    assert "specific { versions: 7 }" in merged
    assert (base / "batching_parameters.txt").read_text() == "max_batch_size { value: 32 }\n"  # hand-written: kept
    from dare_tf.signatures import MAX_BATCH_SIZE
    from dare_tf.testing.standin_server import BatchingParameters, read_batching_parameters

    # the stand-in's limit from it; TF Serving's default for a field left out: no padding
    assert read_batching_parameters(str(base / "batching_parameters.txt")) == BatchingParameters(32, False)
    os.makedirs(tmp_path / "fresh")
    write_server_configs(str(tmp_path / "fresh"))
    assert read_batching_parameters(str(tmp_path / "fresh" / "batching_parameters.txt")) == BatchingParameters(
        MAX_BATCH_SIZE, True)  # ours: the stand-in's defaults
    write_server_configs(str(base))  # again: nothing to add, nothing changes
    assert (base / "models.config").read_text() == merged
    (base / "models.config").write_text("nonsense {")
    with pytest.raises(ValueError, match="models.config: not a TF Serving model config"):
        write_server_configs(str(base))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.xdist_group("serving_setup")
def test_oversized_requests_are_refused_before_anything_is_allocated(setup):
    import grpc
    import tensorflow as tf
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
def test_rest_answers_every_hostile_body(setup):
    import http.client
    import json

    port = int(setup["rest"].rsplit(":", 1)[1])

    def post(path, body: bytes, length=None):
        connection = http.client.HTTPConnection("localhost", port, timeout=30)
        connection.putrequest("POST", path)
        connection.putheader("Content-Length", str(len(body) if length is None else length))
        connection.endheaders()
        connection.send(body)
        response = connection.getresponse()
        answer = response.status, json.loads(response.read())["error" if response.status != 200 else "outputs"]
        connection.close()
        return answer

    path = "/v1/models/dare:predict"
    good = {"target_item": [1], "target_category": [1], "hist_items": [[3]], "hist_categories": [[1]]}
    assert post(path, json.dumps({"inputs": good}).encode())[0] == 200
    assert post("/v1/models/dare/versions/1:predict", json.dumps({"inputs": good}).encode())[0] == 200
    cases = {
        b"[1, 2]": (400, "malformed request: the body must be a JSON object, not list"),
        b"7": (400, "malformed request: the body must be a JSON object, not int"),
        b"[" * 100_000 + b"]" * 100_000: (400, "malformed request: the body is not JSON (RecursionError)"),
        json.dumps({"inputs": [1, 2]}).encode():
            (400, "malformed request: 'inputs' must be an object naming each input of 'serving_default': "
                  "['hist_categories', 'hist_items', 'target_category', 'target_item']"),
        json.dumps({"instances": 3}).encode(): (400, "malformed request: 'instances' must be a non-empty list"),
        json.dumps({"inputs": dict(good, extra=[1])}).encode():
            (400, "malformed request: unknown inputs ['extra']; 'serving_default' takes "
                  "['hist_categories', 'hist_items', 'target_category', 'target_item']"),
    }
    for body, (code, message) in cases.items():
        assert post(path, body) == (code, message), body[:40]
    code, message = post("/v1/models/dare/versions/99:predict", json.dumps({"inputs": good}).encode())
    assert code == 404 and message.startswith("Servable not found for request: Specific(dare, 99)")
    code, message = post(path, b"{}", length=100 << 20)  # a claimed 100 MB body is not read
    assert (code, message) == (413, "a body of 104,857,600 bytes is over the server's max_request_bytes of "
                                     "67,108,864")
    # the dataset signature over REST: string outputs come back as JSON strings
    items, _ = raw_maps(setup["data_dir"])
    code, outputs = post(path, json.dumps({"signature_name": "dataset", "inputs": {"item_ids": [next(iter(items)), -5]}}
                                          ).encode())
    assert code == 200 and outputs["known"] == [True, False] and isinstance(outputs["id_maps"][0], str)
    assert post(path, json.dumps({"inputs": good}).encode())[0] == 200  # the server lives on


@pytest.mark.xdist_group("serving_setup")
def test_rest_never_reads_a_body_as_the_next_request_and_bounds_its_workers(setup):
    """A request hidden in the body of a 404'd request is never run, and the next good
    request on the kept-alive connection is answered; chunked bodies are refused with
    the connection closed; GET is the model's status; when every REST worker is busy
    a request waits its timeout, then gets 503."""
    import json
    import socket
    import threading

    from dare_tf.testing.requests import Limits
    from dare_tf.testing.rest import RestHandler
    from dare_tf.testing.standin_server import LoadedModel, _HTTPServer

    port = int(setup["rest"].rsplit(":", 1)[1])
    good = json.dumps({"inputs": {"target_item": [1], "target_category": [1], "hist_items": [[3]],
                                  "hist_categories": [[1]]}}).encode()

    def request(method, path, body=b"", headers=()):
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{h}\r\n" for h in headers)
        return (head + (f"Content-Length: {len(body)}\r\n" if not headers else "") + "\r\n").encode() + body

    def answers(raw: bytes, expected: int) -> list[tuple[int, dict]]:
        """Sends `raw` on one connection and reads `expected` answers (fewer if it
        closes), then checks that nothing more comes."""
        with socket.create_connection(("localhost", port), timeout=30) as sock:
            sock.sendall(raw)
            reader, out = sock.makefile("rb"), []
            for _ in range(expected):
                status = reader.readline()
                if not status:
                    return out
                headers = {}
                while (line := reader.readline().strip()):
                    key, _, value = line.decode().partition(":")
                    headers[key.lower()] = value.strip()
                out.append((int(status.split()[1]), json.loads(reader.read(int(headers["content-length"])))))
            sock.settimeout(0.5)
            try:
                assert not sock.recv(1), "an answer more than the requests sent"
            except TimeoutError:
                pass
            return out

    smuggled = request("POST", "/v1/models/dare:predict", good)
    got = answers(request("POST", "/v1/models/nope:predict", smuggled) + request("POST", "/v1/models/dare:predict",
                                                                                 good), 2)
    assert [code for code, _ in got] == [404, 200], got  # the hidden request was a body, not a request
    got = answers(request("POST", "/v1/models/dare/versions/99:predict", smuggled) + request(
        "POST", "/v1/models/dare:predict", good), 2)
    assert [code for code, _ in got] == [404, 200], got
    got = answers(request("POST", "/v1/models/dare:predict", b"5\r\nhello\r\n0\r\n\r\n" + smuggled,
                          headers=("Transfer-Encoding: chunked",)), 1)
    assert got == [(411, {"error": "a body needs a Content-Length (chunked bodies are not taken)"})], got
    got = answers(request("GET", "/v1/models/dare") + request("GET", "/v1/models/dare/versions/7") +
                  request("DELETE", "/v1/models/dare"), 3)
    assert got[0] == (200, {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                                                      "status": {"error_code": "OK", "error_message": ""}}]})
    assert got[1][0] == 404 and got[2][0] == 501 and "error" in got[2][1], got
    # every worker busy: the next request waits the timeout, then 503, its body unread
    limits = Limits(rest_workers=1, request_timeout_s=0.3)
    workers = threading.BoundedSemaphore(1)
    handler = type("Handler", (RestHandler,), {"models": {"dare": LoadedModel(os.path.dirname(setup["path"]), "dare")},
                                               "limits": limits, "workers": workers})
    server = _HTTPServer(("localhost", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        workers.acquire()  # the one worker is taken
        got = answers(request("POST", "/v1/models/dare:predict", good), 1)
        assert got == [(503, {"error": "no REST worker free within 0.3 s (1 at once); retry later"})], got
        workers.release()
        assert answers(request("POST", "/v1/models/dare:predict", good), 1)[0][0] == 200
    finally:
        server.shutdown()


@pytest.mark.xdist_group("serving_setup")
def test_client_program_explains_in_the_requests_raw_ids(setup, tmp_path):
    import json
    import subprocess
    import sys

    from tests.conftest import ENV, REPO

    items = [int(r) for r in read_id_map(setup["data_dir"], "item")]
    cats = [int(r) for r in read_id_map(setup["data_dir"], "category")]
    history = items[10:16]
    request = {"target_item": [items[3], items[4]], "target_category": [cats[1], cats[2]],
               "hist_items": [history, history], "hist_categories": [cats[:6], cats[:6]]}
    (tmp_path / "request.json").write_text(json.dumps(request))

    def client(*flags):
        done = subprocess.run([sys.executable, "-m", "serving.client", f"--server=localhost:{setup['port']}",
                               "--model_name=dare", "--signature=explain",
                               f"--request_json={tmp_path / 'request.json'}", *flags], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=120)
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
    assert "| rank | behaviour item | category | clicks ago | weight |" in table
    # REST failures end the program in one line, as gRPC's do
    for flags, message in [((f"--rest_url={setup['rest']}", "--model_name=nope"),
                            f"error: {setup['rest']}: REST predict failed (HTTP 404): "),
                           (("--rest_url=http://127.0.0.1:1",), "error: http://127.0.0.1:1: no REST server answers")]:
        done = subprocess.run([sys.executable, "-m", "serving.client", "--model_name=dare",
                               f"--request_json={tmp_path / 'request.json'}", *flags], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(message), done.stderr[-2000:]
