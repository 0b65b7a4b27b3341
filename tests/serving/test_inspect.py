"""dare_tf.serving.inspect and serving/inspect.py: the page's data is `rank_explain`
on the store's history, its bad inputs get their HTTP status and one-line
message, and in headless Chromium the timeline highlights exactly the kept
behaviours (dare_tf.testing.browser)."""

import os
import re
import subprocess
import sys

import grpc
import numpy as np
import pytest

from dare_tf.data.storage.id_maps import id_map_digest, read_id_map
from dare_tf.signatures import RANK_EXPLAIN

SOURCES = np.array(["two_tower", "popularity", "recent_categories", "filler"] * 3)


def _fixed_retrieval(data_dir, candidates, categories):
    class FixedRetrieval:  # the same 12 candidates, with their sources, for everyone
        model_name = "retrieval"

        def predict_tensors(self, inputs, signature="serving_default"):
            if signature == "dataset":
                return {"known": np.ones(1, bool), "id_maps": np.array([id_map_digest(data_dir).encode()])}
            return {"items": candidates[None], "categories": categories[None],
                    "scores": np.linspace(1, 0, len(candidates))[None],
                    "sources": np.array([[s.encode() for s in SOURCES]])}

    return FixedRetrieval()


class _Refused(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.xdist_group("serving_setup")
def test_the_page_data_is_rank_explain_on_the_stored_history_and_errors_have_statuses(setup, tmp_path):
    from dare_tf.histories import open_store
    from dare_tf.serving.client import ServingClient
    from dare_tf.serving.encoding import rank_results, rank_tensors
    from dare_tf.serving.inspect import Inspector, create_app

    data_dir, target = setup["data_dir"], f"localhost:{setup['port']}"
    raw_items = np.array([int(r) for r in read_id_map(data_dir, "item")], np.int64)
    raw_cats = np.array([int(r) for r in read_id_map(data_dir, "category")], np.int64)
    candidates, categories = raw_items[100:112], raw_cats[np.arange(12) % len(raw_cats)]
    url = f"lmdb:{tmp_path / 'histories'}"
    with open_store(url) as writer:
        writer.append(7, raw_items[:30], raw_cats[np.arange(30) % 5], np.arange(30) * 60 + 1_700_000_000)
        # issue 69 (5): a live click of a department no training row has
        writer.append(8, [*raw_items[:3], raw_items[4]], [*raw_cats[:3], 999_999], np.arange(4) + 1_700_000_000)
    store = open_store(url, read_only=True)
    ranker = ServingClient(target, "dare")
    inspector = Inspector(_fixed_retrieval(data_dir, candidates, categories), [ranker, ServingClient(target, "dare")],
                          store, target)
    page = create_app(inspector).test_client()
    answer = page.get("/api/users/7?top=5")
    assert answer.status_code == 200, answer.get_json()
    view = answer.get_json()
    # the reference: one rank_explain request on the stored history and the 12 candidates
    history = store.last([7])
    inputs = rank_tensors([history.items[0, :30]], [history.categories[0, :30]], [candidates], [categories])
    expected = rank_results(inputs, ranker.predict_tensors(inputs, RANK_EXPLAIN))[0]
    order = np.argsort(-expected["probability"], kind="stable")
    assert view["models"] == ["dare", "dare"] and view["candidates"] == 12 and view["unknown"] is None
    assert page.get("/api/users/8").get_json()["unknown"] == (
        "the newest click's category 999999: not in the models' vocabulary (new since the dataset): data.prepare "
        "--append, then train with --init_from (of the history's 4 clicks, 0 of an unknown item, 1 of an unknown "
        "category)")
    assert view["history"]["items"] == raw_items[:30].tolist()
    assert view["history"]["times"] == (np.arange(30) * 60 + 1_700_000_000).tolist()
    assert len(view["recommendations"]) == 5
    for row, c in zip(view["recommendations"], order[:5]):
        assert (row["item"], row["category"], row["retrieval_rank"], row["source"]) == (
            candidates[c], categories[c], c + 1, SOURCES[c])
        kept = {i: w for i, w in zip(expected["history_index"][c], expected["attention_weight"][c]) if i >= 0}
        for ranker_view in row["rankers"]:  # (the same model twice: the same answer beside itself)
            assert ranker_view["probability"] == pytest.approx(expected["probability"][c], abs=1e-6)
            assert ranker_view["place"] == int(np.flatnonzero(order == c)[0]) + 1
            assert {k["index"]: pytest.approx(k["weight"], abs=1e-6) for k in ranker_view["kept"]} == kept
            assert len(kept) == 5 and sum(k["weight"] for k in ranker_view["kept"]) == pytest.approx(1, abs=1e-5)
            weights = [k["weight"] for k in ranker_view["kept"]]
            assert weights == sorted(weights, reverse=True)
    assert page.get("/").status_code == 200 and b"dare" in page.get("/").data
    assert page.get("/plotly.min.js").status_code == 200
    # bad input: each its status and one line; the store is never written
    for path, status, message in [
            ("/api/users/abc", 400, "user id 'abc' is not an integer id (the history store's ids are int64)"),
            ("/api/users/99", 404, f"the history store {url} holds no clicks of user 99"),
            ("/api/users/7?top=0", 400, "n=None, top=0: both must be >= 1"),
            # Issue 59 (9): an id holding `/` reaches the store's check (werkzeug's HTML 404 before), and any
            # other /api/ address answers JSON; (10) n past the retrieval model's --top_n is the caller's 400.
            ("/api/users/dept%2F123", 400, "user id 'dept/123' is not an integer id (the history store's ids are "
                                           "int64)"),
            ("/api/nothing/here", 404, "no such address: /api/nothing/here (the page's data is at /api/users/<id>)"),
            ("/api/users/7?n=13", 400, "n=13: the retrieval model 'retrieval' returns 12 candidates (its export's "
                                       "--top_n, at most the catalogue); ask for at most that")]:
        got = page.get(path)
        assert (got.status_code, got.get_json()) == (status, {"error": message})
    down = Inspector.connect("localhost:1", "dare", store, timeout=2)
    got = create_app(down).test_client().get("/api/users/7")
    assert got.status_code == 503
    assert got.get_json()["error"] == ("the model server localhost:1 does not answer (UNAVAILABLE): start it, or "
                                       "check --server")

    class NoExplain:  # a ranker exported before rank_explain existed, as TF Serving refuses it
        model_name = "old"

        def predict_tensors(self, inputs, signature="serving_default"):
            if signature == RANK_EXPLAIN:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f'Serving signature key "{RANK_EXPLAIN}" not found.')
            return ranker.predict_tensors(inputs, signature)

    old = Inspector(_fixed_retrieval(data_dir, candidates, categories), [NoExplain()], store, target)
    got = create_app(old).test_client().get("/api/users/7")
    assert (got.status_code, got.get_json()["error"]) == (
        502, "a ranker of ['old'] has no 'rank_explain' signature: export it again with this version (python -m "
             "serving.export)")

    class Unreachable:
        url = "redis://127.0.0.1:1"

        def last(self, users, max_len=None):
            raise ConnectionError("Connection refused")

    got = create_app(Inspector(inspector.clients[0], [ranker], Unreachable())).test_client().get("/api/users/7")
    assert (got.status_code, got.get_json()["error"]) == (
        503, "the history store redis://127.0.0.1:1 did not answer: Connection refused")
    assert store.last([7]).lengths.tolist() == [30]
    store.close()
    for client in (ranker, *inspector.clients[1:]):
        client.close()


def _start_page(target: str, store_url: str) -> tuple[subprocess.Popen, str]:
    """`python -m serving.inspect` on a free port, and its address."""
    process = subprocess.Popen([sys.executable, "-m", "serving.inspect", f"--server={target}", "--model_name=dare",
                                "--compare=twin", f"--histories={store_url}", "--port=0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = process.stdout.readline()
    found = re.search(r"open (http://\S+/)", line)
    if not found:
        process.kill()
        raise AssertionError(f"serving.inspect did not start: {line}{process.stdout.read()}")
    return process, found.group(1)


def _read(page, expression):
    return page.evaluate(expression)


@pytest.mark.slow
@pytest.mark.tfrs  # the retrieval run (tensorflow-recommenders: tf.keras as Keras 2)
@pytest.mark.xdist_group("two_stage")  # (one worker trains the two-stage runs)
def test_the_page_in_chromium_highlights_exactly_the_kept_behaviours(taobao, two_stage, tmp_path):
    from dare_tf.testing.browser import browser_missing, chromium_page

    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    from dare_tf import build_model
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.export import export_run, export_saved_model
    from dare_tf.histories import open_store
    from dare_tf.serving.recommender import Recommender
    from dare_tf.serving.client import ServingClient
    from dare_tf.testing.model_config import read_model_config
    from dare_tf.testing.standin_server import serve

    exports = str(tmp_path / "exports")
    export_run(two_stage["retrieval"], exports, "retrieval", top_n=50)
    export_run(two_stage["dare"], exports, "dare")
    spec = DatasetSpec.load(taobao)
    export_saved_model(build_model("twin", spec.num_items, spec.num_categories, max_len=spec.max_len, seed=1,
                                   top_k=10), taobao, exports, "twin")
    server, port, _ = serve(read_model_config(os.path.join(exports, "models.config")), 0)
    target = f"localhost:{port}"
    raw_items = np.array([int(r) for r in read_id_map(taobao, "item")], np.int64)
    raw_cats = np.array([int(r) for r in read_id_map(taobao, "category")], np.int64)
    store_url = f"lmdb:{tmp_path / 'histories'}"
    with open_store(store_url) as writer:
        writer.append(42, raw_items[:60:2], raw_cats[np.arange(30) % 6], 1_700_000_000 + 3600 * np.arange(30))
    process, address = _start_page(target, store_url)
    try:
        clients = [ServingClient(target, name) for name in ("retrieval", "dare", "twin")]
        with open_store(store_url, read_only=True) as reader:
            recommenders = [Recommender(clients[0], ranker, reader) for ranker in clients[1:]]
            items, categories, fields = recommenders[0].history_inputs(reader.last([42]))
            retrieved = recommenders[0].retrieve(items, categories)
            expected = [r.rank(items, categories, retrieved, fields, explain=True) for r in recommenders]
        order = np.argsort(-expected[0]["probability"], kind="stable")
        with chromium_page() as page:
            page.goto(address)
            page.fill("#user-id", "42")
            page.click("button[type=submit]")
            page.wait_for_function("document.body.dataset.status === '200'")
            page.click("#recommendations tbody tr[data-row='1']")  # the second recommendation
            page.wait_for_function("document.body.dataset.selected === '1'")
            c = order[1]
            row = page.locator("#recommendations tbody tr[data-row='1'] td").all_inner_texts()
            assert row[:3] == ["2", str(retrieved["items"][c]), str(retrieved["categories"][c])]
            assert row[3] == retrieved["sources"][c] and row[4] == str(c + 1)
            for m, name in enumerate(("dare", "twin")):
                highlighted = _read(page, f"document.getElementById('timeline').data"
                                          f".find(t => t.name === 'kept by {name}').customdata")
                kept = [int(i) for i in expected[m]["history_index"][c] if i >= 0]
                assert sorted(highlighted) == sorted(kept) and len(kept) == 10
                bars = _read(page, f"document.getElementById('attention').data[{m}].y")
                assert sum(bars) == pytest.approx(1, abs=1e-5)
                weights = dict(zip(expected[m]["history_index"][c], expected[m]["attention_weight"][c]))
                on_page = _read(page, f"document.getElementById('attention').data[{m}].customdata")
                assert bars == pytest.approx([weights[i] for i in on_page], abs=1e-6)
            page.screenshot(path=str(tmp_path / "inspect.png"), full_page=True)
            assert os.path.getsize(tmp_path / "inspect.png") > 10_000
            # a live click shows up on reload; the page never writes
            with open_store(store_url) as writer:
                writer.append(42, [raw_items[500]], [raw_cats[1]], [1_700_000_000 + 3600 * 31])
            page.reload()
            page.wait_for_function("document.body.dataset.status === '200'")
            assert _read(page, "document.getElementById('timeline').data[0].x.length") == 31
            # First-day issue (4): clicks loaded without times (0) and one live click: the timeline keeps the
            # clicks' places (it stretched from 1970 to the live click's day), the hover says "time unknown".
            with open_store(store_url) as writer:
                writer.append(43, raw_items[:30], raw_cats[np.arange(30) % 6], [0] * 30)
                writer.append(43, [raw_items[500]], [raw_cats[1]], [1_700_000_000])
            page.fill("#user-id", "43")
            page.click("button[type=submit]")
            page.wait_for_function("document.body.dataset.status === '200' && view.history.items.length === 31")
            assert _read(page, "document.getElementById('timeline').data[0].x") == list(range(31))
            assert _read(page, "document.getElementById('timeline').layout.xaxis.title.text") == (
                "click, oldest first (30 of the clicks have no time in the store)")
            assert _read(page, "document.getElementById('timeline').data[0].text[0]").endswith(", time unknown")
            assert _read(page, "axisName('Garden furniture and outdoor living')") == "Garden furniture and ou\u2026"
            for user, status, message in [
                    ("4242", "404", f"the history store {store_url} holds no clicks of user 4242"),
                    ("abc", "400", "user id 'abc' is not an integer id (the history store's ids are int64)")]:
                page.fill("#user-id", user)
                page.click("button[type=submit]")
                page.wait_for_function(f"document.body.dataset.status === '{status}'")
                assert page.inner_text("#message") == message
            server.stop(0)
            page.fill("#user-id", "42")
            page.click("button[type=submit]")
            page.wait_for_function("document.body.dataset.status === '503'")
            assert page.inner_text("#message") == (f"the model server {target} does not answer (UNAVAILABLE): start "
                                                   "it, or check --server")
        with open_store(store_url, read_only=True) as reader:
            assert reader.last([42]).lengths.tolist() == [31]
    finally:
        process.kill()
        process.wait()
        server.stop(0)


def test_near_uniform_attention_is_noted():
    """Issue 69 (4): 20 attention bars all near 0.05 said nothing; the page notes them."""
    from dare_tf.serving.inspect import near_uniform

    def rows(weights):
        return [{"rankers": [{"kept": [{"index": i, "weight": w} for i, w in enumerate(weights)]}]}]

    assert near_uniform("dare", rows([0.052, 0.049, 0.051, 0.048] + [0.05] * 16)) == (
        "the ranker 'dare''s attention over the 20 behaviours it kept is near uniform (every weight within 25% of "
        "1/20): it tells them little apart, as an undertrained model does")
    assert near_uniform("dare", rows([0.5, 0.3, 0.2])) is None
    assert near_uniform("dare", rows([1.0])) is None and near_uniform("dare", []) is None
