"""The TFRS retrieval stage. Ordinary pytest functions, each run in a fresh process of
its own (`own_process`, tests/conftest.py): TFRS needs `tf.keras` to be Keras 2, which
is resolved once per process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
pytestmark = pytest.mark.own_process


def recall_at_k(q, c, ids, positives, ks):
    """Share of queries whose positive is among the k highest dot products."""
    scores = q @ c.T
    positive = scores[np.arange(len(positives)), np.searchsorted(ids, positives)]
    rank = (scores > positive[:, None]).sum(axis=1)
    return {f"recall@{k}": float((rank < k).mean()) for k in ks}


def test_factorized_top_k_recall_and_the_index_match_numpy_and_keras3_coexists():
    import tensorflow as tf

    import dare_tf
    from dare_tf.retrieval import TwoTowerModel, brute_force_index

    rng = np.random.default_rng(0)
    items = np.arange(1, 300, dtype=np.int32); cats = (items % 7 + 1).astype(np.int32)
    model = TwoTowerModel(301, 9, 8, 8, (items, cats), ks=(1, 5, 20))
    hist = rng.integers(0, 300, (64, 12)).astype(np.int32); hist[:, :3] = 0
    pos = rng.choice(items, 64).astype(np.int32)
    x = {"hist_items": hist, "hist_categories": np.where(hist > 0, hist % 7 + 1, 0).astype(np.int32),
         "target_item": pos, "target_category": (pos % 7 + 1).astype(np.int32)}
    model.query(x); model.candidate((items, cats))  # build
    for w in model.trainable_variables:  # spread the towers so scores differ
        w.assign(rng.normal(0, 1, w.shape))
    model.compile(optimizer="adagrad")
    metrics = model.evaluate(tf.data.Dataset.from_tensor_slices(x).batch(64), return_dict=True, verbose=0)
    q = model.query(x).numpy(); c = model.candidate((items, cats)).numpy()
    ref = recall_at_k(q, c, items, pos, (1, 5, 20))
    got = {f"recall@{k}": metrics[f"factorized_top_k/top_{k}_categorical_accuracy"] for k in (1, 5, 20)}
    _, ids = brute_force_index(model, (items, cats), 10)({"hist_items": hist, "hist_categories": x["hist_categories"]})
    top = items[np.argsort(-(q @ c.T), axis=1, kind="stable")[:, :10]]
    ranker = dare_tf.build_model("dare", 50, 5, max_len=8, top_k=3); ranker.compile(optimizer="adam")
    loss = float(ranker.evaluate(ranker.dummy_inputs(4), np.array([1.0, 0, 1, 0]), verbose=0))
    import keras

    out = {"got": got, "ref": ref, "same_top": bool((ids.numpy() == top).all()),
           "keras3": keras.__version__.startswith("3"), "loss": loss}
    for k, v in out["ref"].items():
        assert out["got"][k] == pytest.approx(v, abs=1e-6), (k, out)
    assert 0 < out["ref"]["recall@20"] < 1
    assert out["same_top"] and out["keras3"] and out["loss"] > 0


def test_tf_keras_resolved_to_keras3_first_is_refused_with_the_fix():
    env = {k: v for k, v in ENV.items() if k != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run([sys.executable, "-c", "import tensorflow as tf\ntf.keras.layers\nimport dare_tf.retrieval\n"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "TF_USE_LEGACY_KERAS=1" in done.stderr and "already resolved to Keras 3" in done.stderr


@pytest.mark.slow
def test_train_retrieval_program_writes_recall_and_the_popularity_baseline(taobao, tmp_path):
    out = tmp_path / "retrieval"
    command = [sys.executable, "-m", "trainers.train_retrieval", f"--data_dir={taobao}", f"--output_dir={out}",
               "--epochs=2", "--batch_size=256"]
    done = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    keys = ["recall@10", "recall@50", "recall@100", "recall@200"]
    for part in ("test", "test_popularity"):
        values = [results[part][k] for k in keys]
        assert values == sorted(values) and 0 <= values[0] and values[-1] <= 1, (part, values)
    assert results["catalogue"] > 1000 and results["test_positives"] == 86
    bad = subprocess.run(command[:-2] + ["--epochs=0"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert bad.returncode == 2 and "--epochs=0: must be >= 1" in bad.stderr
    other = subprocess.run(command[:-2] + ["--epochs=3"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert other.returncode == 1 and "retrieval_config.epochs: 2 in the run, 3 now" in other.stderr
    exported = subprocess.run([sys.executable, "-m", "serving.export", f"--run_dir={out}",
                               f"--export_base={tmp_path / 'exports'}", "--model_name=retrieval", "--top_n=50"],
                              cwd=REPO, env=ENV, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert exported.stdout.strip().endswith(os.path.join("exports", "retrieval", "1"))
    too_many = subprocess.run([sys.executable, "-m", "serving.export", f"--run_dir={out}",
                               f"--export_base={tmp_path / 'exports'}", "--model_name=retrieval",
                               "--top_n=999999"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert too_many.returncode == 1 and "top_n=999999 is larger than the catalogue" in too_many.stderr


@pytest.mark.slow
def test_two_stage_recommend_served_and_in_process(taobao, tmp_path):
    from dare_tf.retrieval import RetrievalConfig, train_retrieval  # noqa: I001 (first: tf.keras)
    from dare_tf import build_model
    from dare_tf.data.protocol import Protocol, prepare
    from dare_tf.data.spec import DatasetSpec, read_id_map
    from dare_tf.data.synthetic import SyntheticConfig, write
    from dare_tf.serving.cascade import LocalModel, Recommender, format_recommendations
    from dare_tf.serving.client import ServingClient
    from dare_tf.export import export_run, export_saved_model
    from dare_tf.testing.standin_server import read_model_config, serve

    data, work = taobao, str(tmp_path)
    exports = os.path.join(work, "exports")
    train_retrieval(data, os.path.join(work, "retrieval"), RetrievalConfig(epochs=1, batch_size=256))
    export_run(os.path.join(work, "retrieval"), exports, "retrieval", top_n=50)
    spec = DatasetSpec.load(data)
    ranker = build_model("dare", spec.num_items, spec.num_categories, max_len=spec.max_len, seed=0, top_k=10)
    export_saved_model(ranker, data, exports, "dare")
    # a ranker of another dataset (other id maps), exported beside them
    write(SyntheticConfig(users=60, items=300, categories=12, min_length=30, max_length=60, length_median=45, seed=5),
          os.path.join(work, "other.csv"))
    prepare("taobao", os.path.join(work, "other.csv"), os.path.join(work, "other"),
            Protocol(min_clicks=20, max_len=20, train_targets=2, stride=2))
    other = DatasetSpec.load(os.path.join(work, "other"))
    export_saved_model(build_model("dare", other.num_items, other.num_categories, max_len=other.max_len, seed=0),
                       os.path.join(work, "other"), exports, "other")
    # the exported top-N equals the in-process index on real test histories (an unknown raw id included)
    from dare_tf.data.pipeline import InMemorySplit
    from dare_tf.retrieval.model import brute_force_index, load_retrieval_model
    from dare_tf.retrieval.training import catalogue
    splits = {s: InMemorySplit.load(data, s, spec) for s in ("train", "val", "test")}
    items, cats = catalogue(spec, splits)
    test = splits["test"].features
    raw_item_of = np.array([0] + [int(r) for r in read_id_map(data, "item")], np.int64)
    raw_cat_of = np.array([0] + [int(r) for r in read_id_map(data, "category")], np.int64)
    h_items, h_cats = raw_item_of[test["hist_items"][:8]], raw_cat_of[test["hist_categories"][:8]]
    h_items[0, -1] = 987654321987
    exported = LocalModel(os.path.join(exports, "retrieval")).predict_tensors({"hist_items": h_items,
                                                                              "hist_categories": h_cats})
    dense = test["hist_items"][:8].copy(); dense[0, -1] = spec.oov_item
    scores, ids = brute_force_index(load_retrieval_model(os.path.join(work, "retrieval"), spec, items, cats),
                                    (items, cats), 50)({"hist_items": dense, "hist_categories": test["hist_categories"][:8]})
    category_of = dict(zip(items.tolist(), cats.tolist()))
    index_check = {"same_items": bool((exported["items"] == raw_item_of[ids.numpy()]).all()),
                   "score_error": float(np.abs(exported["scores"] - scores.numpy()).max()),
                   "categories_ok": bool((exported["categories"] == raw_cat_of[[[category_of[i] for i in row]
                                                                             for row in ids.numpy()]]).all()),
                   "shape": list(exported["items"].shape)}
    models = read_model_config(os.path.join(exports, "models.config"))
    server, port, _ = serve(models, 0)
    target = f"localhost:{port}"
    raw_items = [int(r) for r in read_id_map(data, "item")]
    raw_cats = [int(r) for r in read_id_map(data, "category")]
    hist_items = raw_items[:40:2] + [987654321987]  # the last one is unknown
    hist_cats = raw_cats[:10] * 2 + [5]
    served = Recommender(ServingClient(target, "retrieval"), ServingClient(target, "dare"))
    got = served.recommend(hist_items, hist_cats, n=50, top=10, explain=True)
    local = Recommender(LocalModel(os.path.join(exports, "retrieval")), LocalModel(os.path.join(exports, "dare")))
    same = local.recommend(hist_items, hist_cats, n=50, top=10)
    own = ServingClient(target, "dare").predict(got["items"], got["categories"], [hist_items] * 10, [hist_cats] * 10)
    retrieved = ServingClient(target, "retrieval").predict_tensors(
        {"hist_items": np.array([hist_items]), "hist_categories": np.array([hist_cats])})
    everything = served.recommend(hist_items, hist_cats, n=50, top=50)
    errors = {}
    for name, call in {
            "missing": lambda: Recommender(ServingClient(target, "nope", retries=0), ServingClient(target, "dare"))
            .recommend(hist_items, hist_cats),
            "other_dataset": lambda: Recommender(ServingClient(target, "retrieval"), ServingClient(target, "other"))
            .recommend(hist_items, hist_cats),
            "too_many": lambda: served.recommend(hist_items, hist_cats, n=51),
            "lengths": lambda: served.recommend(hist_items, hist_cats[:-1])}.items():
        try:
            call()
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    empty = served.recommend([], [], n=50, top=5)
    padding = served.recommend([0, 0, 0], [0, 0, 0], n=50, top=5)
    with open(os.path.join(work, "user.json"), "w") as f:
        json.dump({"hist_items": hist_items, "hist_categories": hist_cats}, f)
    cli = subprocess.run([sys.executable, "-m", "serving.client", "recommend", f"--server={target}", "--model_name=dare",
                          f"--request_json={os.path.join(work, 'user.json')}", "--num_candidates=50", "--top=5",
                          "--explain"], capture_output=True, text=True)
    cli_missing = subprocess.run([sys.executable, "-m", "serving.client", "recommend", f"--server={target}",
                                  "--model_name=dare", "--retrieval_model=nope", "--retries=0",
                                  f"--request_json={os.path.join(work, 'user.json')}"], capture_output=True, text=True)
    server.stop(0)
    out = json.loads(json.dumps({
        "probability": got["probability"].tolist(), "own": own["probability"].tolist(),
        "local_items": same["items"].tolist(), "items": got["items"].tolist(),
        "local_probability": same["probability"].tolist(),
        "retrieved": retrieved["items"][0].tolist(), "everything": everything["items"].tolist(),
        "retrieval_rank": got["retrieval_rank"].tolist(),
        "history_index": got["history_index"].tolist(), "attention_weight": got["attention_weight"].tolist(),
        "errors": errors, "empty": empty["probability"].tolist(), "padding": padding["probability"].tolist(),
        "table": format_recommendations(got, hist_items, hist_cats), "models": sorted(models), "index": index_check,
        "cli": [cli.returncode, cli.stdout, cli.stderr[-2000:]], "cli_missing": [cli_missing.returncode, cli_missing.stderr[-500:]]}))
    index = out["index"]
    assert index["same_items"] and index["categories_ok"] and index["score_error"] < 1e-5, index
    assert index["shape"] == [8, 50], index
    assert out["models"] == ["dare", "other", "retrieval"]  # one models.config lists every export
    probability = np.array(out["probability"])
    assert len(probability) == 10 and (np.diff(probability) <= 0).all()  # sorted by the ranker
    np.testing.assert_allclose(probability, out["own"], atol=1e-6)  # = the ranker's own predictions
    assert out["items"] == out["local_items"]  # served == in process
    np.testing.assert_allclose(probability, out["local_probability"], atol=1e-6)
    # the top 10 are the 10 most probable of the retrieval model's 50 candidates
    assert set(out["items"]) <= set(out["retrieved"]) and out["everything"][:10] == out["items"]
    assert sorted(out["everything"]) == sorted(out["retrieved"])
    assert [out["retrieved"][r - 1] for r in out["retrieval_rank"]] == out["items"]
    history_index, weight = np.array(out["history_index"]), np.array(out["attention_weight"])
    assert history_index.shape == (10, 10) and history_index.max() < 21 and (weight[history_index >= 0] > 0).all()
    errors = out["errors"]
    assert "the retrieval model 'nope' is not served" in errors["missing"], errors
    assert "exported from different datasets" in errors["other_dataset"], errors
    assert "n=51: the retrieval model 'retrieval' returns 50 candidates" in errors["too_many"], errors
    assert "hist_items has 21 ids but hist_categories 20" in errors["lengths"], errors
    assert len(out["empty"]) == 5 and np.isfinite(out["empty"]).all() and out["empty"] == out["padding"]
    code, stdout, stderr = out["cli"]
    assert code == 0, stderr
    assert "| rank | item | category | P(click) |" in stdout and len(stdout.strip().splitlines()) == 7
    assert f"| 1 | {out['items'][0]} |" in stdout
    code, stderr = out["cli_missing"]
    assert code == 1 and "the retrieval model 'nope' is not served" in stderr


@pytest.mark.slow
def test_cascade_evaluation_matches_the_retrieval_recall_and_a_per_example_reference(taobao, tmp_path):
    from dare_tf.retrieval import RetrievalConfig, evaluate_cascade, train_retrieval  # noqa: I001
    from dare_tf.retrieval.cascade import rerank
    from dare_tf.training import TrainConfig, train
    data, work = taobao, str(tmp_path)
    retrieval = train_retrieval(data, os.path.join(work, "retrieval"), RetrievalConfig(epochs=2, batch_size=256))
    train(data, os.path.join(work, "dare"), TrainConfig.create(preset="dare", batch_size=256, epochs=1, eval_every=20,
                                                         verbose=0, model_overrides=dict(top_k=10)))
    out = evaluate_cascade(data, os.path.join(work, "retrieval"), {"dare": os.path.join(work, "dare")},
                           os.path.join(work, "cascade"), num_candidates=200, k=10, report=lambda s: None)
    import keras
    model = keras.models.load_model(os.path.join(work, "dare", "seed_0", "model.keras"))
    rng = np.random.default_rng(0)
    examples = {"hist_items": rng.integers(1, 50, (3, 200)).astype(np.int32),
                "hist_categories": rng.integers(1, 9, (3, 200)).astype(np.int32)}
    candidates = rng.permutation(np.arange(1, 400))[:60].reshape(3, 20)
    category_of = np.arange(500) % 9 + 1
    reordered = rerank(model, examples, candidates, category_of, rows_per_call=16)
    reference = []
    for e in range(3):  # one candidate at a time
        p = [float(model.predict_on_batch({"target_item": np.array([c], np.int32),
                                           "target_category": np.array([category_of[c]], np.int32),
                                           "hist_items": examples["hist_items"][e:e + 1],
                                           "hist_categories": examples["hist_categories"][e:e + 1]})[0])
             for c in candidates[e]]
        reference.append(dict(zip(candidates[e].tolist(), p)))
    try:
        evaluate_cascade(data, os.path.join(work, "retrieval"), {"dare": os.path.join(work, "dare")},
                         os.path.join(work, "cascade"), num_candidates=100, k=10, report=lambda s: None)
        refused = None
    except ValueError as e:
        refused = str(e)
    out = json.loads(json.dumps({"cascade": out, "retrieval": retrieval["test"], "reordered": reordered.tolist(),
                      "reference": reference, "refused": refused,
                      "written": json.load(open(os.path.join(work, "cascade", "cascade.json"))) == out}))
    cascade, tfrs_recall = out["cascade"], out["retrieval"]
    assert cascade["examples"] == 86
    # the brute-force cascade and TFRS's FactorizedTopK agree: retrieval's HitRate@10 is its recall@10
    assert cascade["retrieval"]["hit_rate@10"] == pytest.approx(tfrs_recall["recall@10"], abs=1e-6)
    assert cascade["retrieval"]["recall@200"] == pytest.approx(tfrs_recall["recall@200"], abs=1e-6)
    assert cascade["retrieval"]["ndcg@10"] <= cascade["retrieval"]["hit_rate@10"]
    dare = cascade["rankers"]["dare"]
    assert 0 <= dare["ndcg@10"] <= dare["hit_rate@10"] <= cascade["retrieval"]["recall@200"]
    # The batched order is the one-at-a-time probabilities' order (ties within float
    # noise of the batch size may swap).
    for reordered, probability in zip(out["reordered"], out["reference"]):
        p = [probability[str(c)] for c in reordered]
        assert sorted(reordered) == sorted(int(c) for c in probability)
        assert all(a >= b - 1e-6 for a, b in zip(p, p[1:])), p
    assert out["written"]
    assert "holds a cascade evaluation of another configuration" in out["refused"]
