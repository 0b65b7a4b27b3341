"""dare_tf.export.fields: a model with further fields (a brand, a shop, the time
gap) exported and served: raw values in through every signature equal the Keras
model on the dataset's own examples, `rank` equals `serving_default` per
candidate, and a request without a field, or with one the model lacks, is
refused naming it."""

import grpc
import numpy as np
import pytest
import tensorflow as tf

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.serving.client import ServingClient, make_example
from dare_tf.serving.encoding import rank_results, rank_tensors, request_tensors
from tests.data.storage.test_fields import FORMAT, PER_USER, field_rows, write_log

L = 8
pytestmark = pytest.mark.xdist_group("export_fields")  # (one worker builds the module's export)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from dare_tf import build_model
    from dare_tf.export import ranker
    from dare_tf.training.config import dataset_fields

    root = tmp_path_factory.mktemp("export_fields")
    data_dir = str(root / "data")
    spec = prepare(FORMAT, write_log(root / "log.csv", field_rows()), data_dir, PER_USER)
    model = build_model("dare", spec.num_items, spec.num_categories, max_len=L, top_k=4, initializer="keras",
                        seed=3, fields=dataset_fields(spec, "all"))
    rng = np.random.default_rng(0)
    for table in model.embedding.weights:
        table.assign(rng.normal(0, 0.5, table.shape))
    path = ranker.export_saved_model(model, data_dir, str(root / "exports"), "dare")
    raw = {k: np.array([0] + [int(v) for v in read_id_map(data_dir, k)]) for k in ("item", "category")}
    for name in ("brand", "shop"):
        raw[name] = np.array([0] + [int(v) for v in open(f"{data_dir}/{name}_ids.txt").read().split()])
    return dict(root=root, data_dir=data_dir, spec=spec, model=model, path=path, raw=raw,
                module=tf.saved_model.load(path))


def _requests(exported, n=24):
    """The val split's first `n` examples as raw-value requests (each history
    without its padding; a time gap as its bucket's lower edge) and the Keras
    model's probabilities on their dense features."""
    split = InMemorySplit.load(exported["data_dir"], "val", max_len=L)
    f = {k: v[:n] for k, v in split.features.items()}
    raw, edges = exported["raw"], [0] + [2 ** i for i in range(41)]
    keep = [row > 0 for row in f["hist_items"]]
    hist = {k: [list(raw[name][row[m]]) for row, m in zip(f[k], keep)]
            for k, name in (("hist_items", "item"), ("hist_categories", "category"), ("hist_brand", "brand"),
                            ("hist_shop", "shop"))}
    hist["hist_time_gap"] = [[edges[b - 1] for b in row[m]] for row, m in zip(f["hist_time_gap"], keep)]
    targets = {k: raw[name][f[k]] for k, name in (("target_item", "item"), ("target_category", "category"),
                                                  ("target_brand", "brand"), ("target_shop", "shop"))}
    model = exported["model"]
    expected = np.asarray(model.predict_on_batch({k: v for k, v in f.items() if k != "uid"})).reshape(-1)
    return targets, hist, expected


def _call(exported, signature, inputs):
    return {k: v.numpy() for k, v in exported["module"].signatures[signature](
        **{k: tf.constant(v) for k, v in inputs.items()}).items()}


def test_every_signature_takes_the_fields_raw_values(exported):
    targets, hist, expected = _requests(exported)
    fields = {k: v for k, v in {**targets, **hist}.items() if "brand" in k or "shop" in k or "gap" in k}
    inputs = request_tensors(targets["target_item"], targets["target_category"], hist["hist_items"],
                             hist["hist_categories"], fields)
    assert set(inputs) == {"target_item", "target_category", "hist_items", "hist_categories", "target_brand",
                           "target_shop", "hist_brand", "hist_shop", "hist_time_gap"}
    np.testing.assert_allclose(_call(exported, "serving_default", inputs)["probability"], expected, atol=1e-5)
    np.testing.assert_allclose(_call(exported, "explain", inputs)["probability"], expected, atol=1e-5)
    examples = [make_example(targets["target_item"][i], targets["target_category"][i], hist["hist_items"][i],
                             hist["hist_categories"][i], {k: v[i] for k, v in fields.items()}).SerializeToString()
                for i in range(len(expected))]
    np.testing.assert_allclose(_call(exported, "regress", {"inputs": np.array(examples)})["outputs"], expected,
                               atol=1e-5)
    # rank: each user's history against its own target and two other examples' targets
    n = len(expected)
    pick = lambda k, u: [targets[k][u], targets[k][(u + 1) % n], targets[k][(u + 5) % n]]  # noqa: E731
    rank_inputs = rank_tensors(hist["hist_items"], hist["hist_categories"],
                               [pick("target_item", u) for u in range(n)], [pick("target_category", u)
                                                                            for u in range(n)],
                               {**{k: hist[k] for k in ("hist_brand", "hist_shop", "hist_time_gap")},
                                "candidate_brand": [pick("target_brand", u) for u in range(n)],
                                "candidate_shop": [pick("target_shop", u) for u in range(n)]})
    ranked = rank_results(rank_inputs, _call(exported, "rank", rank_inputs))
    np.testing.assert_allclose([r["probability"][0] for r in ranked], expected, atol=1e-5)
    again = request_tensors([pick("target_item", 0)[1]], [pick("target_category", 0)[1]], hist["hist_items"][:1],
                            hist["hist_categories"][:1], {
                                "target_brand": [pick("target_brand", 0)[1]],
                                "target_shop": [pick("target_shop", 0)[1]],
                                **{k: hist[k][:1] for k in ("hist_brand", "hist_shop", "hist_time_gap")}})
    np.testing.assert_allclose(ranked[0]["probability"][1], _call(exported, "serving_default", again)[
        "probability"][0], atol=1e-5)


def test_a_request_missing_a_field_or_with_another_is_refused_naming_it(exported):
    from dare_tf.testing.standin_server import serve

    targets, hist, expected = _requests(exported, n=4)
    fields = {k: v for k, v in {**targets, **hist}.items() if "brand" in k or "shop" in k or "gap" in k}
    server, port, _ = serve({"dare": str(exported["root"] / "exports" / "dare")}, 0)
    try:
        client = ServingClient(f"localhost:{port}", "dare", retries=0)
        got = client.predict(targets["target_item"], targets["target_category"], hist["hist_items"],
                             hist["hist_categories"], fields=fields)["probability"]
        np.testing.assert_allclose(got, expected, atol=1e-5)
        for change, message in ((lambda d: d.pop("target_brand"), "missing target_brand ("),
                                (lambda d: d.update(hist_colour=d["hist_brand"]), "not in the signature: hist_colour")):
            bad = dict(fields)
            change(bad)
            with pytest.raises(grpc.RpcError) as e:
                client.predict(targets["target_item"], targets["target_category"], hist["hist_items"],
                               hist["hist_categories"], fields=bad)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in e.value.details() and "\n" not in e.value.details()
        # Issue 45: a negative time gap (a behaviour after the request's time) is its row's own error.
        future = dict(fields, hist_time_gap=[list(g) for g in fields["hist_time_gap"]])
        future["hist_time_gap"][2][-1] = -5
        with pytest.raises(ValueError, match=r"^serving_default: row 2 of the request was refused: hist_time_gap "
                                             r"holds a negative gap, -5 \(a behaviour after the request's time\)$"):
            client.predict(targets["target_item"], targets["target_category"], hist["hist_items"],
                           hist["hist_categories"], fields=future)
        # Regress and Classify have no per-row error: the request fails with the row's reason (it was scored 0).
        example = make_example(targets["target_item"][2], targets["target_category"][2], hist["hist_items"][2],
                               hist["hist_categories"][2], {k: v[2] for k, v in future.items()})
        with pytest.raises(grpc.RpcError) as e:
            client.regress([example])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert ("an example of the request was refused:" in e.value.details()
                and "hist_time_gap holds a negative gap, -5" in e.value.details()), e.value.details()
        client.close()
    finally:
        server.stop(0).wait()
    with pytest.raises(ValueError, match=r"^fields\['hist_brand'\]: one list per history, as long as it \(row 0: "):
        request_tensors(targets["target_item"], targets["target_category"], hist["hist_items"],
                        hist["hist_categories"], dict(fields, hist_brand=[[1]] * 4))


def test_a_model_whose_fields_are_not_the_datasets_is_refused(exported, tmp_path):
    from dare_tf import build_model
    from dare_tf.export import ranker

    spec = exported["spec"]
    model = build_model("dare", spec.num_items, spec.num_categories, max_len=L, top_k=4,
                        fields=[{"name": "brand", "vocabulary": 5}])
    with pytest.raises(ValueError, match=r"^the model's field 'brand' \(vocabulary 5\) is not one of .*spec.json's "
                                         r"fields \[\('brand', \d+\), \('shop', \d+\), \('time_gap', 43\)\]$"):
        ranker.export_saved_model(model, exported["data_dir"], str(tmp_path / "exports"), "dare")


def test_recommend_reads_the_fields_from_the_history_service(exported, tmp_path):
    """`Recommender.recommend_user` with a ranker that reads fields: the history's
    fields and click times come from the history service (loaded from the
    dataset), the candidates' fields from the ranker's `item_fields`; the answer
    is the ranker's `rank` of those values, built here from the dataset's files."""
    from dare_tf.histories import open_store
    from dare_tf.histories.prepared import load_prepared
    from dare_tf.serving.recommender import LocalModel, Recommender

    data_dir, spec, raw = exported["data_dir"], exported["spec"], exported["raw"]
    ranker = LocalModel(exported["path"], "dare")
    digest = ranker.predict_tensors({"item_ids": np.zeros([1], np.int64)}, "dataset")
    assert digest["fields"][0].decode() == "brand,shop,time_gap"
    assert int(digest["max_len"][0]) == L  # issue 69 (1): the length the ranker reads (the dataset's is longer)
    candidates = raw["item"][1:13]
    item_category = np.loadtxt(f"{data_dir}/item_categories.txt", dtype=np.int64)
    categories = raw["category"][item_category[:12]]

    class FixedRetrieval:  # a retrieval stage that proposes the same candidates to everyone
        model_name = "fixed"

        def predict_tensors(self, inputs, signature="serving_default"):
            if signature == "dataset":
                return {"known": np.ones(1, bool), "id_maps": digest["id_maps"]}
            return {"items": candidates[None], "categories": categories[None], "scores": np.zeros((1, 12))}

    with open_store(f"lmdb:{tmp_path / 'histories'}", fields=spec.field_schema.columns) as store:
        load_prepared(store, data_dir)
        user = next(iter(store.users()))
        history = store.last([user])
        now = int(history.times.max()) + 1000
        result, sent = Recommender(FixedRetrieval(), ranker, store).recommend_user(user, n=12, top=12, now=now)
    n = history.lengths[0]
    # The store keeps the whole history; recommend sends the newest the ranker reads.
    assert n > L and sent.lengths[0] == L
    assert (sent.items[0, :L] == history.items[0, :n][-L:]).all()
    of_item = {name: raw[name][np.loadtxt(f"{data_dir}/item_{name}.txt", dtype=np.int64)[:12]]
               for name in ("brand", "shop")}
    inputs = rank_tensors([history.items[0, :n]], [history.categories[0, :n]], [candidates], [categories], {
        "hist_brand": [history.fields["brand"][0, :n]], "hist_shop": [history.fields["shop"][0, :n]],
        "hist_time_gap": [now - history.times[0, :n]], "candidate_brand": [of_item["brand"]],
        "candidate_shop": [of_item["shop"]]})
    expected = rank_results(inputs, ranker.predict_tensors(inputs, "rank"))[0]["probability"]
    np.testing.assert_allclose(result["probability"], np.sort(expected)[::-1], atol=1e-6)
    with open_store(f"lmdb:{tmp_path / 'plain'}") as plain:
        plain.append(user, [1], [1], [1])
        with pytest.raises(ValueError, match=r"^the ranker 'dare' reads the fields \['brand', 'shop', 'time_gap'\], "
                                             r"but the history store lmdb:.*plain keeps none: it lacks brand, shop$"):
            Recommender(FixedRetrieval(), ranker, plain).recommend_user(user, n=12, top=3)
    with pytest.raises(ValueError, match=r"^the ranker 'dare' reads the fields \['brand', 'shop', 'time_gap'\]: "
                                         r"give hist_shop, hist_time_gap$"):
        Recommender(FixedRetrieval(), ranker).recommend([candidates[0]], [categories[0]], 12, 3,
                                                        fields={"hist_brand": [1]})


def test_a_history_only_action_field_is_served_by_its_raw_codes(exported, tmp_path):
    """`--action_field`'s `action` has an id map and no item value: the export maps
    `hist_action`'s raw codes and its `item_fields` signature leaves it out."""
    import dataclasses

    from dare_tf.layers.behavior_fields import BehaviorField
    from dare_tf.export.fields import ServedFields

    (tmp_path / "action_ids.txt").write_text("1\n3\n2\n")  # raw action codes in dense order (pv, cart, buy)
    spec = dataclasses.replace(exported["spec"], fields=[{"name": "action", "vocabulary": 5, "history_only": True,
                                                           "column": "3"}])
    served = ServedFields([BehaviorField("action", 5, history_only=True)], spec, str(tmp_path))
    assert served.schema.inputs("hist") == ["hist_action"] and served.schema.inputs("target") == [] \
        and not served.raw_of_item
    assert served.dense("action", tf.constant([[1, 2, 3, 4]], tf.int64)).numpy().tolist() == [[1, 3, 2, 4]]


def test_a_click_the_models_do_not_know_is_named_as_such(exported):
    """Issue 69 (5): a live click of a category (and item) in no training row gave `0 of the
    newest click's category Animalerie`, true but silent on why; the ranker's `vocabulary`
    signature says which clicks it has no row for, and `recommend` names them."""
    from dare_tf.serving.encoding import vocabulary_line
    from dare_tf.serving.recommender import LocalModel, Recommender

    raw = exported["raw"]
    ranker = LocalModel(exported["path"], "dare")
    items = np.array([raw["item"][1], raw["item"][2], 987654321, raw["item"][3]], np.int64)
    categories = np.array([raw["category"][1], 55555, 55555, 44444], np.int64)
    known = ranker.predict_tensors({"item_ids": items, "category_ids": categories}, "vocabulary")
    assert known["item_known"].tolist() == [True, True, False, True]
    assert known["category_known"].tolist() == [True, False, False, False]
    recommender = Recommender(None, ranker)
    unknown = recommender.unknown_clicks(np.append(0, items), np.append(0, categories))  # (a padding slot first)
    assert unknown == {"clicks": 4, "items": 1, "categories": 3, "newest_item": None, "newest_category": 44444}
    assert vocabulary_line(unknown) == (
        "the newest click's category 44444: not in the models' vocabulary (new since the dataset): data.prepare "
        "--append, then train with --init_from (of the history's 4 clicks, 1 of an unknown item, 3 of an unknown "
        "category)")
    assert vocabulary_line(recommender.unknown_clicks(items[:1], categories[:1])) is None  # every click known


def test_a_runs_warnings_travel_with_its_export_and_recommend_says_them(exported, tmp_path):
    """Issue 69 (4): an undertrained model (the trainer warned) was exported and served without
    comment; its run's warnings travel in the `dataset` signature and `recommend` says them."""
    from dare_tf.export import ranker
    from dare_tf.serving.client import LocalModel, dataset_of
    from dare_tf.serving.encoding import notes_line

    warned = ["seed 0: the schedule gives 27 training steps (6912 examples, batch 256, 1 epochs; fewer than 50): "
              "too few to train a model; lower --batch_size (--batch_size=128: 54 steps) or raise --epochs"]
    path = ranker.export_saved_model(exported["model"], exported["data_dir"], str(tmp_path / "exports"), "dare",
                                     notes=warned)
    assert dataset_of(LocalModel(path, "dare"), "ranking")["notes"] == warned
    assert dataset_of(LocalModel(exported["path"], "dare"), "ranking")["notes"] == []  # (a run without warnings)
    assert notes_line("dare", warned) == f"the ranker 'dare' was flagged when it was trained: {warned[0]}"
    assert notes_line("dare", []) is None
