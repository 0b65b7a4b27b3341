"""dare_tf.export.ranker: the DareModel SavedModel equals the Keras model, lists its
signatures and methods, refuses bad requests in one line, and never leaves a partial version."""

import os
import shutil
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tensorflow as tf

from dare_tf import build_model
from dare_tf.export import ranker as export_lib
from dare_tf.serving.client import ServingClient, make_example
from dare_tf.serving.encoding import pad_histories
from tests.served import L, in_process, requests


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
def test_bad_inputs_give_defined_results_or_invalid_argument(setup):
    client = ServingClient(f"localhost:{setup['port']}", "dare", retries=0)
    good = {"target_item": np.array([1, 2], np.int64), "target_category": np.array([1, 2], np.int64),
            "hist_items": np.array([[-3, 0, 5], [-3, 7, -3]], np.int64),  # (each row behind its -T)
            "hist_categories": np.array([[-3, 0, 5], [-3, 7, 1]], np.int64)}
    # Unknown and negative ids are defined: OOV rows, padding in histories.
    neg = dict(good, target_item=np.array([-1, 10**15], np.int64))
    assert np.all(np.isfinite(client.predict_tensors(neg)["probability"]))
    # One history ([1, T]) is shared by every target: the same as repeating it (the export, in
    # process); a batching server refuses it, as TF Serving's batching session does.
    from dare_tf.serving.recommender import LocalModel

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
        ({k: v for k, v in good.items() if k != "hist_items"},
         "^the request's inputs do not match signature 'serving_default': missing hist_items \\(it takes "),
        (dict(good, hist_brand=good["hist_items"]), "not in the signature: hist_brand"),
    ]
    for inputs, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            client.predict_tensors(inputs)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() and __import__("re").search(message, err.value.details()), err.value.details()
    # A row's own values: its error, raised by the client (a batch merged with it is not failed).
    for inputs, message in [
            (dict(good, hist_categories=np.array([[-4, 1, 2, 3], [-4, 1, 2, 3]], np.int64)),
             "serving_default: row 0 of the request was refused: hist_categories is not as wide as hist_items (its "
             "leading column states 4, against 3)"),
            (dict(good, hist_items=good["hist_items"][:, 1:], hist_categories=good["hist_categories"][:, 1:]),
             "serving_default: row 0 of the request was refused: hist_items must start with a column of minus its "
             "width (-T for a [rows, T] input, as serving.client writes it); this row starts with 0")]:
        with pytest.raises(ValueError) as err:
            client.predict_tensors(inputs)
        assert str(err.value) == message
    with pytest.raises(grpc.RpcError) as err:
        ServingClient(f"localhost:{setup['port']}", "nope", retries=0).predict_tensors(good)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # Still serving.
    assert client.predict_tensors(good)["probability"].shape == (2,)


# The methods of the export's graph that its signatures trace.
SIGNATURE_METHODS = ("predict", "explain", "rank", "rank_explain", "classify", "regress", "dataset", "vocabulary")


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
    # Each signature is traced once (Classify and Regress call serving_default's function): an
    # export traced every one twice, once outside saving to list its variables (keras.export).
    traced = {}

    def counting(name, method):
        def counted(self, *args):
            traced[name] = traced.get(name, 0) + 1
            return method(self, *args)
        return counted

    for name in SIGNATURE_METHODS:
        monkeypatch.setattr(export_lib._ServingGraph, name, counting(name, getattr(export_lib._ServingGraph, name)))
    path = export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")
    assert traced == dict.fromkeys(SIGNATURE_METHODS, 1)
    monkeypatch.undo()
    assert os.path.basename(path) == "1"
    assert os.path.basename(export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare")) == "2"
    with pytest.raises(FileExistsError, match="immutable"):
        export_lib.export_saved_model(setup["model"], setup["data_dir"], base, "dare", version=2)
    shutil.rmtree(base)


@pytest.mark.xdist_group("serving_setup")
def test_wrong_rank_requests_name_the_input_and_shape(setup):
    client = ServingClient(f"localhost:{setup['port']}", "dare", retries=0)
    good = {"target_item": np.array([1, 2], np.int64), "target_category": np.array([1, 2], np.int64),
            "hist_items": np.array([[-3, 0, 5], [-3, 7, 3]], np.int64),
            "hist_categories": np.array([[-3, 0, 5], [-3, 7, 1]], np.int64)}
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
    with pytest.raises(ValueError, match=r"target_item: expected integers, got 1.5"):
        client.predict([1.5], [1], [[3]], [[1]])
    with pytest.raises(ValueError, match=r"hist_items\[0\]: expected integers, got 2.5"):
        client.predict([1], [1], [[3, 2.5]], [[1, 1]])
    with pytest.raises(ValueError, match=r"hist_items: expected integers, got True"):
        make_example(1, 2, [True], [1])

    def rest(inputs):
        body = json.dumps({"inputs": inputs}).encode()
        request = urllib.request.Request(f"{setup['rest']}/v1/models/dare:predict", data=body)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    good = {"target_item": [1], "target_category": [1], "hist_items": [[-2, 3]], "hist_categories": [[-2, 1]]}
    assert rest(good)[0] == 200
    code, body = rest(dict(good, target_item=[1.5]))
    assert code == 400 and "1.5 is not an integer id" in body["error"]
    code, body = rest(dict(good, hist_items=[[-2, 2 ** 70]]))
    assert code == 400 and "outside the int64 range" in body["error"]
    assert rest(good)[0] == 200  # the handler lives on


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


@pytest.mark.xdist_group("serving_setup")
def test_an_edited_id_map_is_refused_by_the_export_and_the_history_load(setup, tmp_path):
    """Issue 45 (10): two raw ids swapped in item_ids.txt were exported without a word
    (the id maps were outside the integrity checks): every raw id would score as
    another item. The table's sha256 is recorded at preparation and checked."""
    import shutil

    from dare_tf.data.storage.spec import SpecError
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared

    data = str(tmp_path / "data")
    shutil.copytree(setup["data_dir"], data)
    path = os.path.join(data, "item_ids.txt")
    lines = open(path).read().splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    open(path, "w").write("".join(lines))
    message = (f"^{path}: its sha256 is [0-9a-f]{{16}}, not the [0-9a-f]{{16}} that spec.json records: the file was "
               "changed after preparation, and raw ids mapped through it would be other ids; restore it, or prepare "
               "the dataset again$")
    with pytest.raises(SpecError, match=message):
        export_lib.export_saved_model(setup["model"], data, str(tmp_path / "exports"), "dare")
    assert not os.path.exists(tmp_path / "exports" / "dare" / "1")
    with open_store(f"lmdb:{tmp_path / 'histories'}") as store, pytest.raises(SpecError, match=message):
        load_prepared(store, data)
