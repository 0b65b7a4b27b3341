"""Two-stage recommendation served (retrieval, then the ranker) and in process."""

import json
import os

import numpy as np
import pytest
from tests.programs import run_program


@pytest.mark.slow
@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
@pytest.mark.xdist_group("two_stage")  # (one worker trains the two-stage runs)
def test_two_stage_recommend_served_and_in_process(taobao, two_stage, tmp_path):
    from dare_tf import build_model
    from dare_tf.data.preparation.protocol import Protocol
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.id_maps import read_id_map
    from dare_tf.data.generation.synthetic import SyntheticConfig, write
    from dare_tf.serving.encoding import format_recommendations
    from dare_tf.serving.recommender import LocalModel, Recommender
    from dare_tf.serving.client import ServingClient
    from dare_tf.export import export_run, export_saved_model
    from dare_tf.testing.model_config import read_model_config
    from dare_tf.testing.standin_server import serve

    data, work = taobao, str(tmp_path)
    exports = os.path.join(work, "exports")
    export_run(two_stage["retrieval"], exports, "retrieval", top_n=50)
    spec = DatasetSpec.load(data)
    export_run(two_stage["dare"], exports, "dare")  # the trained ranker (DARE, top_k 10)
    # a ranker of another dataset (other id maps), exported beside them
    write(SyntheticConfig(users=60, items=300, categories=12, min_length=30, max_length=60, length_median=45, seed=5),
          os.path.join(work, "other.csv"))
    prepare("taobao", os.path.join(work, "other.csv"), os.path.join(work, "other"),
            Protocol(min_clicks=20, max_len=20, train_targets=2, stride=2))
    other = DatasetSpec.load(os.path.join(work, "other"))
    export_saved_model(build_model("dare", other.num_items, other.num_categories, max_len=other.max_len, seed=0),
                       os.path.join(work, "other"), exports, "other")
    # the exported top-N equals the in-process index on real test histories (an unknown raw id included)
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.retrieval.model import load_retrieval_model
    from dare_tf.retrieval.training import (candidate_merger, catalogue, merged_candidates, positives,
                                            tower_scores)
    from dare_tf.run_directory import RunDirectory
    splits = {s: InMemorySplit.load(data, s, spec) for s in ("train", "val", "test")}
    items, cats = catalogue(data, spec, splits)
    test = splits["test"].features
    raw_item_of = np.array([0] + [int(r) for r in read_id_map(data, "item")], np.int64)
    raw_cat_of = np.array([0] + [int(r) for r in read_id_map(data, "category")], np.int64)
    h_items, h_cats = raw_item_of[test["hist_items"][:8]], raw_cat_of[test["hist_categories"][:8]]
    h_items[0, -1] = 987654321987
    exported = LocalModel(os.path.join(exports, "retrieval")).predict_tensors({"hist_items": h_items,
                                                                              "hist_categories": h_cats})
    dense = test["hist_items"][:8].copy()
    dense[0, -1] = spec.oov_item
    # The export's candidates are the run's merged candidates (its quotas; seen items excluded).
    model = load_retrieval_model(two_stage["retrieval"], spec, items, cats)
    examples = {"hist_items": dense, "hist_categories": test["hist_categories"][:8]}
    ids = merged_candidates(model, candidate_merger(spec, (items, cats), positives(splits["train"])), (items, cats),
                            examples, RunDirectory(two_stage["retrieval"]).results()["quotas"], 50, False)
    scores = np.take_along_axis(tower_scores(model, (items, cats))(dense.astype(np.int32),
                                                                   examples["hist_categories"].astype(np.int32))
                                .numpy(), ids - 1, axis=1)
    category_of = dict(zip(items.tolist(), cats.tolist()))
    # every candidate has the category the log gives its item (item_categories.txt), never the unknown -1
    log_category = {int(i): int(c) for i, c in zip(read_id_map(data, "item"), (
        raw_cat_of[int(c)] for c in open(os.path.join(data, "item_categories.txt")).read().split()))}
    index_check = {"same_items": bool((exported["items"] == raw_item_of[ids]).all()),
                   "score_error": float(np.abs(exported["scores"] - scores).max()),
                   "categories_ok": bool((exported["categories"] == raw_cat_of[[[category_of[i] for i in row]
                                                                             for row in ids]]).all())
                   and [[log_category[i] for i in row] for row in exported["items"].tolist()]
                   == exported["categories"].tolist(),
                   "unseen": not any(set(row) & set(h) for row, h in zip(exported["items"].tolist(),
                                                                         h_items.tolist())),
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
    retrieval_export = LocalModel(os.path.join(exports, "retrieval"))
    no_history = retrieval_export.predict_tensors({"hist_items": np.zeros((1, 0), np.int64),
                                                   "hist_categories": np.zeros((1, 0), np.int64)})
    only_padding = retrieval_export.predict_tensors({"hist_items": np.zeros((1, 3), np.int64),
                                                     "hist_categories": np.zeros((1, 3), np.int64)})
    assert (no_history["items"] == only_padding["items"]).all()  # [1, 0]: a defined answer, as the ranker's
    padding = served.recommend([0, 0, 0], [0, 0, 0], n=50, top=5)
    # The history service: recommend by user id; clicks appended while the server runs
    # change the next recommendation; an unknown user gets the empty history's answer.
    # User 42 is a test example's user (its history as the log has it); then 40 clicks of
    # items of a category that user never clicked (issue 65 (2)).
    from dare_tf.histories import open_store
    item_category = np.array([0] + [int(c) for c in open(os.path.join(data, "item_categories.txt")).read().split()])
    real = test["hist_items"][0][test["hist_items"][0] > 0]
    members = np.bincount(item_category[1:], minlength=spec.num_categories)
    new = next(c for c in np.argsort(-members, kind="stable") if c > 0 and c not in set(item_category[real]))
    clicks = np.resize(np.flatnonzero(item_category == new), 40)
    store_url = f"lmdb:{os.path.join(work, 'histories')}"
    with open_store(store_url) as store:
        store.append(42, raw_item_of[real].tolist(), raw_cat_of[item_category[real]].tolist(), list(range(len(real))))
        by_user = Recommender(ServingClient(target, "retrieval"), ServingClient(target, "dare"), histories=store)
        before, _ = by_user.recommend_user(42, n=50, top=10)
        same_history = served.recommend(raw_item_of[real], raw_cat_of[item_category[real]], n=50, top=10)
        store.append(42, raw_item_of[clicks].tolist(), [int(raw_cat_of[new])] * 40, list(range(1000, 1040)))
        after, seen = by_user.recommend_user(42, n=50, top=10)
        unknown, _ = by_user.recommend_user(4242, n=50, top=5)
        store.append(43, [int(raw_item_of[real[0]])], [777777], [5000])  # issue 69 (5): a department never seen
    user_cli = run_program("serving.client", "recommend", f"--server={target}", "--model_name=dare", "--user_id=42",
                           f"--histories={store_url}", "--num_candidates=50", "--top=10", "--format=json")
    unknown_cli = run_program("serving.client", "recommend", f"--server={target}", "--model_name=dare",
                              "--user_id=4242", f"--histories={store_url}", "--num_candidates=50", "--top=5",
                              "--now=2026-11-01T00:00:00Z")
    new_department = run_program("serving.client", "recommend", f"--server={target}", "--model_name=dare",
                                 "--user_id=43", f"--histories={store_url}", "--num_candidates=50", "--top=5")
    bad_store = run_program("serving.client", "recommend", f"--server={target}", "--model_name=dare", "--user_id=42",
                            "--histories=redis://127.0.0.1:1")
    live = {"before": before["items"].tolist(), "same": same_history["items"].tolist(),
            "after": after["items"].tolist(), "after_candidates": after["candidates"], "new": int(raw_cat_of[new]),
            "clicks": len(real) + 40, "seen": int(seen.lengths[0]), "max_len": by_user.max_len,
            "unknown": unknown["probability"].tolist(),
            "cli": json.loads(user_cli.stdout) if user_cli.returncode == 0 else user_cli.stderr,
            "unknown_cli": [unknown_cli.returncode, unknown_cli.stdout, unknown_cli.stderr[-2000:]],
            "new_department": [new_department.returncode, new_department.stdout, new_department.stderr[-2000:]],
            "bad_store": [bad_store.returncode, bad_store.stderr.strip().splitlines()]}
    with open(os.path.join(work, "user.json"), "w") as f:
        json.dump({"hist_items": hist_items, "hist_categories": hist_cats}, f)
    cli = run_program("serving.client", "recommend", f"--server={target}", "--model_name=dare",
                      f"--request_json={os.path.join(work, 'user.json')}", "--num_candidates=50", "--top=5",
                      "--explain")
    server.stop(0)
    out = json.loads(json.dumps({
        "probability": got["probability"].tolist(), "own": own["probability"].tolist(),
        "local_items": same["items"].tolist(), "items": got["items"].tolist(),
        "local_probability": same["probability"].tolist(),
        "retrieved": retrieved["items"][0].tolist(), "everything": everything["items"].tolist(),
        "retrieval_rank": got["retrieval_rank"].tolist(), "source": got["source"].tolist(),
        "sources": [s.decode() for s in retrieved["sources"][0]],
        "history_index": got["history_index"].tolist(), "attention_weight": got["attention_weight"].tolist(),
        "errors": errors, "empty": empty["probability"].tolist(), "padding": padding["probability"].tolist(),
        "table": format_recommendations(got, hist_items, hist_cats), "models": sorted(models), "index": index_check,
        "cli": [cli.returncode, cli.stdout, cli.stderr[-2000:]], "live": live}))
    live = out["live"]
    assert live["before"] == live["same"]  # the stored history answers as the request's
    # The new category's items reach the candidates (the recent-categories source, whose quota has a
    # floor), and the trained ranker's top ten moves.
    assert live["after_candidates"]["newest_category"] == live["new"], live["after_candidates"]
    assert live["after_candidates"]["in_newest_category"] > 0, live["after_candidates"]
    # The newest clicks up to the length the ranker reads, as its export says (issue 69 (1)).
    assert live["max_len"] == spec.max_len and live["seen"] == min(live["clicks"], spec.max_len), live
    assert live["after"] != live["before"], live
    assert live["cli"]["items"] == live["after"] and (live["cli"]["user_id"], live["cli"]["history_clicks"]) == (
        "42", live["seen"]), live["cli"]
    assert live["unknown"] == out["empty"]
    code, stdout, stderr = live["new_department"]
    assert code == 0 and stdout.splitlines()[3] == (
        "the newest click's category 777777: not in the models' vocabulary (new since the dataset): data.prepare "
        "--append, then train with --init_from (of the history's 1 click, 0 of an unknown item, 1 of an unknown "
        "category)"), (stdout, stderr)
    code, stdout, stderr = live["unknown_cli"]  # said, not silently answered with plausible items
    assert code == 0, stderr
    assert stdout.splitlines()[0] == (f"user 4242: no clicks in {store_url} (an unknown user, or none yet): ranked "
                                      "for an empty history")
    assert stdout.splitlines()[1].startswith("the 50 candidates: "), stdout
    assert live["bad_store"][0] == 1 and len(live["bad_store"][1]) == 1, live["bad_store"]
    assert "redis://127.0.0.1:1: no Redis server answers" in live["bad_store"][1][0]
    index = out["index"]
    assert index["same_items"] and index["categories_ok"] and index["score_error"] < 1e-5 and index["unseen"], index
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
    # what placed each candidate (the merge's origins: tests/retrieval/test_candidates.py), in the result too
    assert [out["sources"][r - 1] for r in out["retrieval_rank"]] == out["source"]
    assert set(out["sources"]) <= {"two_tower", "popularity", "recent_categories", "filler", "seen"}
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
    assert "| rank | item | category | P(click) |" in stdout and len(stdout.strip().splitlines()) == 10
    assert f"| 1 | {out['items'][0]} |" in stdout
    # The run warned (19 steps): said with its export (issue 69 (4)); the request's last item is
    # unknown to the models (issue 69 (5)): each said in a line of its own.
    assert stdout.splitlines()[1].startswith("the ranker 'dare' was flagged when it was trained: seed 0: the schedule "
                                             "gives "), stdout
    assert stdout.splitlines()[2] == (
        "the newest click's item 987654321987: not in the models' vocabulary (new since the dataset): data.prepare "
        f"--append, then train with --init_from (of the history's {len(hist_items)} clicks, 1 of an unknown item, 0 "
        "of an unknown category)"), stdout
    # what the 50 candidates hold (first-day issue (5)): by source, and of the history's newest category
    first = stdout.splitlines()[0]
    assert first.startswith("the 50 candidates: ") and " two_tower, " in first, first
    assert first.endswith(f" of the newest click's category {hist_cats[-1]}"), first


def test_the_first_line_names_the_history_and_its_newest_click():
    """First-day issue (5): `recommend --user_id` printed the same first line before and after a live
    click; it names the history's size and its newest click, whose time a click loaded from a
    dataset prepared without times does not have (`time unknown`, not 1970)."""
    from dare_tf.histories.base import Histories
    from dare_tf.serving.encoding import history_line

    history = Histories(items=np.array([["SKU 1", "Lamp", ""]], object),
                        categories=np.array([["Toys", "Home & Garden", ""]], object),
                        times=np.array([[0, 1512381600, 0]]), lengths=np.array([2]))
    assert history_line("cust-ed2192", history, "lmdb:h") == (
        "user cust-ed2192: 2 clicks in lmdb:h; the newest: item Lamp, category Home & Garden, 2017-12-04 10:00:00 UTC "
        "(1512381600)")
    history.times[0, 1] = 0
    assert history_line(7, history, "lmdb:h").endswith("category Home & Garden, time unknown")
    history.lengths[0] = 0
    assert history_line(7, history, "lmdb:h") == (
        "user 7: no clicks in lmdb:h (an unknown user, or none yet): ranked for an empty history")


def test_the_second_line_counts_the_candidates_by_source_and_of_the_newest_category():
    """First-day issue (5): after clicks of a new category the ranker's top ten may not move (the
    retrieval run's quotas chosen on validation can give `recent_categories` no share); the
    second line shows what the click did change: the candidates of its category, by source."""
    from dare_tf.serving.encoding import candidates_line
    from dare_tf.serving.recommender import candidate_counts

    retrieved = {"items": np.array(["a", "b", "c", "d"], object),
                 "categories": np.array(["Toys", "Electronics", "Electronics", "Toys"], object),
                 "sources": np.array(["two_tower", "recent_categories", "recent_categories", "popularity"])}
    counts = candidate_counts(retrieved, np.array(["Toys", "Electronics"], object))
    assert counts == {"n": 4, "sources": {"popularity": 1, "recent_categories": 2, "two_tower": 1},
                      "newest_category": "Electronics", "in_newest_category": 2}
    assert candidates_line(counts) == ("the 4 candidates: 1 two_tower, 1 popularity, 2 recent_categories; 2 of "
                                       "the newest click's category Electronics")
    del retrieved["sources"]
    assert candidates_line(candidate_counts(retrieved, np.array([7]))) == (
        "the 4 candidates: 0 of the newest click's category 7")
    assert candidates_line(candidate_counts(retrieved, np.zeros(0))) == "the 4 candidates"
