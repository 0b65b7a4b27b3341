"""String ids served (`--string_ids`): the export of a string-id dataset answers every
signature as its integer twin's export answers the same requests in integer ids
(in process and through the stand-in), unknown strings go where unknown integers
go, the history service keeps the strings, and `recommend` by a string user id
answers in them."""

import os

import numpy as np
import pytest

from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.id_maps import read_id_file, read_id_map
from tests.data.logs.test_string_ids import INTS, PER_USER, STRINGS, write_twins

pytestmark = pytest.mark.xdist_group("string_ids")  # (one worker builds the module's exports)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The Taobao sample's first rows as an integer log and its string twin (a brand
    field), prepared, and one DARE model with the brand exported from each."""
    import csv

    from dare_tf import build_model
    from dare_tf.export import export_saved_model
    from dare_tf.serving.recommender import LocalModel
    from dare_tf.training.config import dataset_fields
    from tests.data.preparation.test_prepare import TAOBAO

    root = tmp_path_factory.mktemp("string_ids")
    with open(TAOBAO) as f:
        rows = list(csv.reader(f))[:15000]
    ints, strings = write_twins(root, rows, "log")
    out = {}
    for kind, fmt, path in (("ints", INTS, ints), ("strings", STRINGS, strings)):
        data_dir = str(root / kind)
        spec = prepare(fmt, path, data_dir, PER_USER)
        model = build_model("dare", spec.num_items, spec.num_categories, max_len=20, top_k=5, seed=3,
                            initializer="keras", fields=dataset_fields(spec, "all"))
        rng = np.random.default_rng(0)
        for table in model.embedding.weights:
            table.assign(rng.normal(0, 0.5, table.shape))
        version = export_saved_model(model, data_dir, str(root / f"exports_{kind}"), "dare")
        maps = {k: read_id_map(data_dir, k) for k in ("item", "category", "user")}
        maps["brand"] = read_id_file(os.path.join(data_dir, "brand_ids.txt"))
        typed = (lambda v: v) if kind == "strings" else int
        out[kind] = dict(data_dir=data_dir, version=version, local=LocalModel(version), exports=str(root /
                         f"exports_{kind}"), ids={k: [typed(v) for v in m] for k, m in maps.items()})
    return out


def _requests(ids, unknown):
    """Requests of dense ids drawn once, in a twin's raw ids (`unknown`: an id neither knows)."""
    rng = np.random.default_rng(1)
    pick = {k: rng.integers(0, len(v), 40) for k, v in ids.items()}

    def raw(kind, at):
        return [ids[kind][i] for i in at]

    history = raw("item", pick["item"][:25]) + [unknown]
    categories = raw("category", pick["category"][:26])
    brands = raw("brand", pick["brand"][:26])
    return dict(history=history, categories=categories, brands=brands,
                targets=raw("item", pick["item"][25:28]), target_categories=raw("category", pick["category"][25:28]),
                target_brands=raw("brand", pick["brand"][25:27]) + [unknown],
                candidates=raw("item", pick["item"][28:40]) + [unknown],
                candidate_categories=raw("category", pick["category"][28:40]) + [ids["category"][0]],
                candidate_brands=raw("brand", pick["brand"][28:40]) + [unknown])


def _answers(model, r):
    from dare_tf.serving.client import make_example
    from dare_tf.serving.encoding import rank_results, rank_tensors, request_tensors

    histories = [r["history"], r["history"][:7], []]
    fields = {"target_brand": r["target_brands"],
              "hist_brand": [r["brands"], r["brands"][:7], []]}
    request = request_tensors(r["targets"], r["target_categories"], histories,
                              [r["categories"], r["categories"][:7], []], fields)
    ranked = rank_tensors([r["history"]], [r["categories"]], [r["candidates"]], [r["candidate_categories"]],
                          {"hist_brand": [r["brands"]], "candidate_brand": [r["candidate_brands"]]})
    explained = rank_results(ranked, model.predict_tensors(ranked, "rank_explain"))[0]
    example = make_example(r["targets"][0], r["target_categories"][0], r["history"], r["categories"],
                           {"target_brand": r["target_brands"][0], "hist_brand": r["brands"]})
    return {"predict": model.predict_tensors(request)["probability"],
            "explain": model.predict_tensors(request, "explain")["history_index"],
            "rank": rank_results(ranked, model.predict_tensors(ranked, "rank"))[0]["probability"],
            "rank_explain": (explained["probability"], explained["history_index"], explained["attention_weight"]),
            "example": example}


def test_a_string_id_export_answers_as_its_integer_twin(twins):
    import tensorflow as tf

    from dare_tf.serving.recommender import dataset_of

    ints, strings = twins["ints"], twins["strings"]
    requests = {kind: _requests(twins[kind]["ids"], unknown)
                for kind, unknown in (("ints", 987654321987), ("strings", "NOPE-never-seen"))}
    got = {kind: _answers(twins[kind]["local"], request) for kind, request in requests.items()}
    assert got["ints"]["predict"].std() > 1e-3
    for name in ("predict", "explain", "rank"):
        np.testing.assert_allclose(got["strings"][name], got["ints"][name], atol=1e-6, err_msg=name)
    for a, b in zip(got["strings"]["rank_explain"], got["ints"]["rank_explain"]):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert got["strings"]["example"].features.feature["hist_items"].bytes_list.value[0] == \
        requests["strings"]["history"][0].encode()
    for kind in ("ints", "strings"):  # Classify reads the tf.Example of each's ids
        module = tf.saved_model.load(twins[kind]["version"])
        out = module.signatures["classify"](inputs=tf.constant([got[kind]["example"].SerializeToString()]))
        got[kind]["classify"] = out["scores"].numpy()
    np.testing.assert_allclose(got["strings"]["classify"], got["ints"]["classify"], atol=1e-6)
    # item_fields: the brand of each item, as the log wrote it (an item without one: OWN_PREFIX + ITEM)
    items = strings["ids"]["item"][:30]
    brands = strings["local"].predict_tensors({"item_ids": np.array(items + ["NOPE"], object)}, "item_fields")
    twin = ints["local"].predict_tensors({"item_ids": np.array(ints["ids"]["item"][:30], np.int64)}, "item_fields")
    from dare_tf.data.logs.string_ids import OWN_PREFIX

    renamed = [f"B{b}" if b >= 0 else f"{OWN_PREFIX}SKU{-1 - b:09d}" for b in twin["brand"].tolist()]
    assert [b.decode() for b in brands["brand"]] == renamed + [""]
    assert dataset_of(strings["local"], "ranking")["strings"] and not dataset_of(ints["local"], "ranking")["strings"]


def test_string_ids_through_the_stand_in_the_history_service_and_recommend(twins, tmp_path):
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.serving.recommender import Recommender
    from dare_tf.serving.client import ServingClient
    from dare_tf.serving.encoding import rank_results, rank_tensors
    from dare_tf.serving.rest import rest_predict
    from dare_tf.testing.standin_server import serve

    server, port, http = serve({"dare": os.path.dirname(twins["strings"]["version"])}, 0, rest_port=0)
    try:
        client = ServingClient(f"localhost:{port}", "dare")
        r = _requests(twins["strings"]["ids"], "NOPE")
        ranked = rank_tensors([r["history"], r["history"][:3]], [r["categories"], r["categories"][:3]],
                              [r["candidates"], r["candidates"][:2]],
                              [r["candidate_categories"], r["candidate_categories"][:2]],
                              {"hist_brand": [r["brands"], r["brands"][:3]],
                               "candidate_brand": [r["candidate_brands"], r["candidate_brands"][:2]]})
        served = rank_results(ranked, client.predict_tensors(ranked, "rank"))
        local = rank_results(ranked, twins["strings"]["local"].predict_tensors(ranked, "rank"))
        answer = rest_predict(f"http://localhost:{http.server_address[1]}", "dare", ranked, "rank")
        rest = rank_results(ranked, {k: np.asarray(v) for k, v in answer.items()})
        for a, b, c in zip(served, local, rest):
            np.testing.assert_allclose(a["probability"], b["probability"], atol=1e-6)
            np.testing.assert_allclose(c["probability"], b["probability"], atol=1e-6)
        # First-day issue (2): JSON numbers or null to the string model are the caller's 400, naming the input
        # (were 500 "Failed to convert a NumPy array to a Tensor").
        for value, shown in ((1, "1"), (None, "null")):
            wrong = dict(ranked, hist_items=ranked["hist_items"].copy())
            wrong["hist_items"][0, 1] = value
            with pytest.raises(ValueError, match=f"REST predict failed \\(HTTP 400\\): .*input hist_items: {shown} "
                                                 "is not a string id \\(this model takes string ids\\)"):
                rest_predict(f"http://localhost:{http.server_address[1]}", "dare", wrong, "rank")
        bad = dict(ranked, hist_items=ranked["hist_items"].copy())
        bad["hist_items"][0, 0] = "wide"
        with pytest.raises(ValueError, match="row 0 of the request was refused: hist_items must start with a column "
                                             "of minus its width"):
            client.predict_tensors(bad, "rank")
        # The history service keeps the strings; recommend by a string user id answers in them.
        stores = {}
        for kind in ("ints", "strings"):
            spec = DatasetSpec.load(twins[kind]["data_dir"])
            stores[kind] = open_store(f"lmdb:{tmp_path / kind}", fields=spec.field_schema.columns,
                                      string_ids=spec.string_ids)
            load_prepared(stores[kind], twins[kind]["data_dir"])
        user = twins["ints"]["ids"]["user"][5]
        int_history, string_history = stores["ints"].last([user]), stores["strings"].last([f"u-{user:x}"])
        assert string_history.lengths.tolist() == int_history.lengths.tolist() and int_history.lengths[0] > 20
        n = int(int_history.lengths[0])
        assert string_history.items[0, :n].tolist() == [f"SKU{i:09d}" for i in int_history.items[0, :n]]
        assert sorted(stores["strings"].users())[:2] == sorted(f"u-{u:x}" for u in stores["ints"].users())[:2]
        results = {}
        for kind, name in (("ints", user), ("strings", f"u-{user:x}")):
            candidates = np.array(twins[kind]["ids"]["item"][:12], object if kind == "strings" else np.int64)
            categories = np.array(twins[kind]["ids"]["category"][:12], candidates.dtype)

            class Fixed:  # a retrieval stage proposing the same 12 items to everyone
                model_name = "fixed"

                def predict_tensors(self, inputs, signature="serving_default", c=candidates, k=categories):
                    if signature == "dataset":
                        return twins[kind]["local"].predict_tensors(inputs, signature)
                    return {"items": c[None], "categories": k[None], "scores": np.zeros((1, 12))}

            results[kind], _ = Recommender(Fixed(), twins[kind]["local"], stores[kind]).recommend_user(
                name, n=12, top=5, explain=True)
        assert results["strings"]["items"].tolist() == [f"SKU{i:09d}" for i in results["ints"]["items"]]
        np.testing.assert_allclose(results["strings"]["probability"], results["ints"]["probability"], atol=1e-6)
        np.testing.assert_array_equal(results["strings"]["history_index"], results["ints"]["history_index"])
        unknown, history = Recommender(Fixed(), twins["strings"]["local"], stores["strings"]).recommend_user(
            "nobody", n=12, top=3)
        assert history.lengths.tolist() == [0] and len(unknown["items"]) == 3
        with pytest.raises(ValueError, match=r"user_id: 'u\\t1' holds a control character"):
            stores["strings"].last(["u\t1"])
        # the inspect page takes the string user id and shows the strings
        from dare_tf.serving.inspect import Inspector, PageError

        page = Inspector(Fixed(), [twins["strings"]["local"]], stores["strings"])
        view = page.user_view(f"u-{user:x}", top=5)
        assert [r["item"] for r in view["recommendations"]] == results["strings"]["items"].tolist()
        assert view["history"]["items"] == string_history.items[0, :n].tolist()
        for typed, status in (("nobody", 404), ("u 1", 404), ("u\t1", 400)):  # (a space is an id's, a tab not)
            with pytest.raises(PageError) as e:
                page.user_view(typed)
            assert e.value.status == status, e.value.message
        for store in stores.values():
            store.close()
    finally:
        server.stop(0)
        http.shutdown()


@pytest.mark.tfrs  # (the retrieval run: tensorflow-recommenders, tf.keras as Keras 2)
def test_a_string_id_retrieval_export_is_its_run_in_strings_and_recommend_answers_in_them(twins, tmp_path):
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.export import export_run
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared
    from dare_tf.retrieval import RetrievalConfig, train_retrieval
    from dare_tf.retrieval.model import load_retrieval_model
    from dare_tf.retrieval.training import candidate_merger, catalogue, merged_candidates, positives
    from dare_tf.run_directory import RunDirectory
    from dare_tf.serving.recommender import LocalModel, Recommender

    data_dir = twins["strings"]["data_dir"]
    run = str(tmp_path / "retrieval")
    train_retrieval(data_dir, run, RetrievalConfig(epochs=1, batch_size=256))
    exported = LocalModel(export_run(run, str(tmp_path / "exports"), "retrieval", top_n=30))
    spec = DatasetSpec.load(data_dir)
    splits = {s: InMemorySplit.load(data_dir, s, spec) for s in ("train", "val", "test")}
    test = {k: v[:6] for k, v in splits["test"].features.items()}
    items, categories = (np.array([""] + twins["strings"]["ids"][k], object) for k in ("item", "category"))
    answer = exported.predict_tensors({"hist_items": np.where(test["hist_items"] > 0, items[test["hist_items"]], ""),
                                       "hist_categories": np.where(test["hist_categories"] > 0,
                                                                   categories[test["hist_categories"]], "")})
    stage = catalogue(data_dir, spec, splits)
    model = load_retrieval_model(run, spec, *stage)
    dense = merged_candidates(model, candidate_merger(spec, stage, positives(splits["train"])), stage,
                              {"hist_items": test["hist_items"], "hist_categories": test["hist_categories"]},
                              RunDirectory(run).results()["quotas"], 30, False)
    assert [[i.decode() for i in row] for row in answer["items"]] == items[dense].tolist()
    with open_store(f"lmdb:{tmp_path / 'histories'}", fields=spec.field_schema.columns, string_ids=True) as store:
        load_prepared(store, data_dir)
        user = next(iter(store.users()))
        result, history = Recommender(exported, twins["strings"]["local"], store).recommend_user(user, n=30, top=5)
    assert isinstance(user, str) and history.lengths[0] > 0
    assert all(isinstance(i, str) and i.startswith("SKU") for i in result["items"])
    assert set(result["source"]) <= {"two_tower", "popularity", "recent_categories", "filler", "seen"}


def test_an_action_field_of_string_ids_exports_loads_appends_and_ranks(tmp_path):
    """Found running a shop log end to end (issue 69): with `--string_ids` and `--action_field`,
    the export built an integer table for the action while its input was a string, and failed
    (`'IdTable' object has no attribute 'stand_in'`); `serving.histories append --action_field`
    to a string store refused the action (`action: 2 is not a string`); and `recommend` asked
    the ranker for the candidates' fields though the action has no item value (`Serving
    signature key "item_fields" not found`). The action now travels as its code in text ("2",
    as `load` reads it from the id map) through the store, the export and the ranker."""
    import csv
    import dataclasses

    from dare_tf import build_model
    from dare_tf.export import export_saved_model
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import append_log, load_prepared
    from dare_tf.serving.encoding import candidate_tensors, history_tensors
    from dare_tf.serving.recommender import LocalModel, Recommender
    from dare_tf.training.config import dataset_fields
    from tests.data.preparation.test_prepare import TAOBAO

    with open(TAOBAO) as f:
        rows = list(csv.reader(f))[:15000]
    _, strings = write_twins(tmp_path, rows, "log")
    fmt = dataclasses.replace(STRINGS, columns=STRINGS.columns[:-1], action_field=True,
                              actions=("pv", "buy", "cart", "fav"))
    data_dir = str(tmp_path / "actions")
    spec = prepare(fmt, strings, data_dir, PER_USER)
    assert [f["name"] for f in spec.fields] == ["action"]
    model = build_model("dare", spec.num_items, spec.num_categories, max_len=20, top_k=5, seed=3,
                        initializer="keras", fields=dataset_fields(spec, "all"))
    local = LocalModel(export_saved_model(model, data_dir, str(tmp_path / "exports"), "dare"))
    with open_store(f"lmdb:{tmp_path / 'histories'}", fields=("action",), string_ids=True) as store:
        load_prepared(store, data_dir)
        user = read_id_map(data_dir, "user")[0]
        item, category = read_id_map(data_dir, "item")[0], read_id_map(data_dir, "category")[0]
        appended = tmp_path / "cart.csv"
        appended.write_text("uid,product,cat,action,ts\n" + f"{user},{item},{category},cart,2017-12-04T10:00:00Z\n")
        assert append_log(store, str(appended), fmt) == 1
        history = store.last([user], 20)
        assert history.fields["action"][0, history.lengths[0] - 1] == "3"  # (cart: the third of --actions)
        inputs = {**history_tensors(history.items, history.categories, history.lengths, {"hist_action": [
                      history.fields["action"][0, :history.lengths[0]]]}),
                  **candidate_tensors([[item, "unknown-sku"]], [[category, category]], {})}
        probability = local.predict_tensors(inputs, "rank")["probability"]
        assert probability.shape == (1, 2) and np.all((probability > 0) & (probability < 1))

    class NoFields:  # (a ranker without `item_fields`: asking it is the fault)
        def predict_tensors(self, inputs, signature):
            raise AssertionError(f"asked {signature}")

    recommender = Recommender.__new__(Recommender)
    recommender.ranker, recommender.fields, recommender.strings = NoFields(), ["action"], True
    recommender.schema = Recommender.field_schema(["action"])
    assert recommender._candidate_fields([item]) == {}
