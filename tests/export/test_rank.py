"""The export's user-major `rank` signature: equal to `serving_default` per
candidate, exact when TF Serving's batcher merges and pads requests of
different lengths (the stand-in pads as `batching_util.cc` does), and one-line
errors for malformed requests."""

import re
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf

from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.export import ranker as export_lib
from dare_tf.serving.client import ServingClient
from dare_tf.serving.encoding import rank_results, rank_tensors, request_tensors
from dare_tf.testing.requests import ServingError
from dare_tf.testing.batcher import Batcher
from dare_tf.testing.loaded_model import LoadedModel
from dare_tf.testing.standin_server import serve

from tests.served import L, sample_model

MAX_CANDIDATES = 30
ULPS = 4 * 2.0**-24  # a few units in the last place of a probability in [0.5, 1)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank")
    data_dir, _, model = sample_model(root)
    path = export_lib.export_saved_model(model, data_dir, str(root / "exports"), "dare",
                                         max_candidates=MAX_CANDIDATES)
    items = np.array([int(r) for r in read_id_map(data_dir, "item")], np.int64)
    categories = np.array([int(r) for r in read_id_map(data_dir, "category")], np.int64)
    return dict(path=path, base=str(root / "exports" / "dare"), items=items, categories=categories)


def _users(export, rng, lengths, counts):
    pick = lambda n, ids: list(rng.choice(ids, n))  # noqa: E731
    return ([pick(t, export["items"]) for t in lengths], [pick(t, export["categories"]) for t in lengths],
            [pick(n, export["items"]) for n in counts], [pick(n, export["categories"]) for n in counts])


def _call(module, signature, inputs):
    return {k: v.numpy() for k, v in module.signatures[signature](**{k: tf.constant(v) for k, v in
                                                                    inputs.items()}).items()}


@pytest.mark.xdist_group("rank_export")
def test_rank_equals_serving_default_per_candidate(export, rng):
    module = tf.saved_model.load(export["path"])
    # histories shorter than L, longer than L, empty; 0 candidates for one user
    users = _users(export, rng, [3, L + 9, 0, 12], [6, 2, 4, 0])
    answers = rank_results(rank_tensors(*users), _call(module, "rank_explain", rank_tensors(*users)))
    for u, answer in enumerate(answers):
        hist_items, hist_categories, items, categories = (part[u] for part in users)
        assert answer["probability"].shape == (len(items),)
        if not items:
            continue
        single = _call(module, "explain", request_tensors(items, categories, [hist_items] * len(items),
                                                         [hist_categories] * len(items)))
        np.testing.assert_allclose(answer["probability"], single["probability"], atol=1e-5)
        width = max(len(hist_items), 0) + 1  # serving_default's request: the client's leading padding
        index = np.where(single["history_index"] >= 0, single["history_index"] - (width - len(hist_items)), -1)
        np.testing.assert_array_equal(answer["history_index"], index)
        kept = answer["history_index"][answer["history_index"] >= 0]
        assert kept.max(initial=0) < max(len(hist_items), 1) and (kept >= max(len(hist_items) - L, 0)).all()
    assert np.asarray(answers[0]["probability"]).std() > 1e-3


@pytest.mark.xdist_group("rank_export")
def test_merged_requests_of_different_lengths_answer_as_alone(export, rng):
    """Two concurrent requests of different T and N go through the stand-in's batcher
    as one padded batch (as TF Serving's) and each gets its own answer: the padding
    is never read. Equal to float rounding, not bit for bit: TensorFlow's CPU
    matrix kernels block their sums by the batch's row count, so one request's
    probability can move by an ulp with the batch it is run in (any model, merged
    or not); reading the padding moved one by 0.05. The same for serving_default
    requests sent by the client (histories behind a 0)."""
    loaded = LoadedModel(export["base"], "dare")
    batcher = Batcher(loaded, timeout_s=2.0)  # waits for the second request
    runs = []
    model_run = loaded.run
    loaded.run = lambda name, definition, inputs: runs.append({k: v.shape for k, v in inputs.items()}) or model_run(
        name, definition, inputs)
    short = rank_tensors(*_users(export, rng, [4], [3]))
    long = rank_tensors(*_users(export, rng, [L + 6], [9]))
    long_default = request_tensors(*_users(export, rng, [L + 6], [2])[2:], *_users(export, rng, [L + 6] * 2, [2])[:2])
    short_default = request_tensors(*_users(export, rng, [5], [3])[2:], *_users(export, rng, [5, 2, 1], [3])[:2])
    for signature, requests in (("rank", (short, long)), ("serving_default", (short_default, long_default))):
        definition = loaded.signature_defs[signature]
        alone = [model_run(signature, definition, r) for r in requests]
        merged = [None, None]
        threads = [threading.Thread(target=lambda i=i: merged.__setitem__(i, batcher.run(signature, definition,
                                                                                         requests[i])))
                   for i in range(2)]
        runs.clear()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(runs) == 1, runs  # one merged, padded batch
        rows = sum(len(next(iter(r.values()))) for r in requests)
        assert next(iter(runs[0].values()))[0] == rows
        for request, got, want in zip(requests, merged, alone):
            if signature == "rank":  # the client cuts the batch's padded width to its own candidates
                got, want = rank_results(request, got), rank_results(request, want)
                for g, w in zip(got, want):
                    np.testing.assert_allclose(g["probability"], w["probability"], rtol=0, atol=ULPS)
            else:
                np.testing.assert_allclose(got["probability"], want["probability"], rtol=0, atol=ULPS)
    # TF Serving's rule: without padding, different widths fail the whole batch
    strict = Batcher(loaded, pad_variable_length_inputs=False)
    with pytest.raises(ServingError, match=r"^Tensors with name 'hist_items' from different tasks have different "):
        strict.merged([short, long])
    empty = rank_tensors(*_users(export, rng, [0], [1]))
    empty["hist_items"], empty["hist_categories"] = (np.zeros((1, 0), np.int64),) * 2
    with pytest.raises(ServingError, match=r"^Got empty tensor in batch of non-empty tensors\.$"):
        batcher.merged([long, empty])


@pytest.mark.xdist_group("rank_export")
def test_rank_through_the_client_and_its_refusals(export, rng):
    server, port, _ = serve({"dare": export["base"]}, 0)
    client = ServingClient(f"localhost:{port}", "dare", retries=0)
    try:
        users = _users(export, rng, [7, 0], [5, 30])
        answers = client.rank(*users, explain=True)
        module = tf.saved_model.load(export["path"])
        want = rank_results(rank_tensors(*users), _call(module, "rank_explain", rank_tensors(*users)))
        for got, expected in zip(answers, want):
            np.testing.assert_allclose(got["probability"], expected["probability"], rtol=0, atol=ULPS)
            np.testing.assert_array_equal(got["history_index"], expected["history_index"])
        errors = {}
        bad = {
            "users": dict(rank_tensors(*users), hist_length=np.array([7], np.int64)),
            "too_many": rank_tensors(*_users(export, rng, [3], [MAX_CANDIDATES + 1])),
            "length": dict(rank_tensors(*users), hist_length=np.array([8, 0], np.int64)),
        }
        with pytest.raises(grpc.RpcError) as e:
            client.predict_tensors(bad["users"], "rank")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # batched (as TF Serving with batching): refused before the model runs; unbatched: by the signature
        assert "every input needs the same 0th-dimension size" in e.value.details()
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"hist_items: its first dimension \(users\) differs from that of hist_length"):
            _call(module, "rank", bad["users"])
        for name in ("too_many", "length"):  # a row's own error, which the client raises
            with pytest.raises(ValueError) as e:
                client.predict_tensors(bad[name], "rank")
            errors[name] = str(e.value)
        assert errors["too_many"] == (
            f"rank: row 0 of the request was refused: candidate_count {MAX_CANDIDATES + 1} is over this export's "
            f"limit of {MAX_CANDIDATES} candidates per user (serving.export --max_candidates)"), errors
        assert errors["length"] == ("rank: row 0 of the request was refused: hist_length 8 is outside [0, 7], the "
                                    "ids its history row carries"), errors
        with pytest.raises(ValueError, match=r"^rank: one history and one candidate list per user; got 2 hist_items"):
            client.rank(users[0], users[1], users[2][:1], users[3][:1])
    finally:
        client.close()
        server.stop(0)


def _merged_answers(loaded, signature, requests):
    """Each request's outputs when all go through one batcher at once (one batch)."""
    batcher = Batcher(loaded, timeout_s=2.0)
    definition = loaded.signature_defs[signature]
    answers = [None] * len(requests)
    calls = []
    run = loaded.run
    loaded.run = lambda *args: calls.append(1) or run(*args)
    try:
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, batcher.run(signature, definition,
                                                                                          requests[i])))
                   for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        loaded.run = run
        batcher.stop()
    assert len(calls) == 1  # one merged, padded batch
    return answers


def _bad_rank_requests(export, rng):
    """Rank requests that the export refused with an assertion failing their whole
    batch, and the error each row now gets alone and merged."""
    over_t = rank_tensors(*_users(export, rng, [3], [4]))
    over_t["hist_length"] = np.array([40], np.int64)  # claims 37 ids it did not send
    over_n = rank_tensors(*_users(export, rng, [5], [2]))
    over_n["candidate_count"] = np.array([9], np.int64)
    over_limit = rank_tensors(*_users(export, rng, [5], [MAX_CANDIDATES + 1]))
    return {
        "hist_length 40 is outside [0, 3], the ids its history row carries": over_t,
        "candidate_count 9 is outside [0, 2], the candidates its row carries": over_n,
        f"candidate_count {MAX_CANDIDATES + 1} is over this export's limit of {MAX_CANDIDATES} candidates per user "
        "(serving.export --max_candidates)": over_limit,
    }


@pytest.mark.xdist_group("rank_export")
def test_one_bad_rank_request_fails_only_itself_when_merged(export, rng):
    """Issue 45 (1, 2): 8 good rank requests (T up to 50, N up to 20) and one bad one
    (hist_length over its T, candidate_count over its N, N over the export's limit)
    in one merged batch: every good one is answered as alone, the bad one gets its
    own error, the same as alone (it read none of the 37 ids it claimed)."""
    loaded = LoadedModel(export["base"], "dare")
    good = [rank_tensors(*_users(export, rng, [t], [n])) for t, n in zip(
        (50, 3, 17, 0, 8, 44, 1, 29), (20, 1, 5, 3, 12, 7, 2, 9))]
    alone = [loaded.run("rank", loaded.signature_defs["rank"], r) for r in good]
    for message, bad in _bad_rank_requests(export, rng).items():
        answers = _merged_answers(loaded, "rank", [*good[:4], bad, *good[4:]])
        got = answers[:4] + answers[5:]
        for request, g, w in zip(good, got, alone):
            for g_user, w_user in zip(rank_results(request, g), rank_results(request, w)):
                np.testing.assert_allclose(g_user["probability"], w_user["probability"], rtol=0, atol=ULPS)
        for outputs in (answers[4], loaded.run("rank", loaded.signature_defs["rank"], bad)):
            assert [e.decode() for e in outputs["error"]] == [message]
            assert not outputs["probability"].any()
            with pytest.raises(ValueError, match=f"^rank: row 0 of the request was refused: {re.escape(message)}$"):
                rank_results(bad, outputs)


@pytest.mark.xdist_group("rank_export")
def test_malformed_serving_default_rows_are_refused_whatever_they_merge_with(export, rng):
    """Issue 45 (2): a serving_default history without its leading column (a real
    first id), and hist_categories narrower than hist_items, answered with the
    row's error, the same alone and merged with a longer request, never scored
    from invented behaviours; the good request of the batch answered as alone."""
    loaded = LoadedModel(export["base"], "dare")
    definition = loaded.signature_defs["serving_default"]
    targets, histories = _users(export, rng, [2], [2])[2:], _users(export, rng, [50, 50], [1])[:2]
    good = request_tensors(*targets, *histories)
    t, c = _users(export, rng, [1], [1])[2:], _users(export, rng, [6], [1])[:2]
    unled = request_tensors(*t, *c)
    unled["hist_items"], unled["hist_categories"] = unled["hist_items"][:, 1:], unled["hist_categories"][:, 1:]
    narrow = request_tensors(*t, *c)
    narrow["hist_categories"] = np.concatenate([[[-4]], narrow["hist_categories"][:, -3:]], axis=1)
    expected = {
        "unled": f"hist_items must start with a column of minus its width (-T for a [rows, T] input, as "
                 f"serving.client writes it); this row starts with {c[0][0][0]}",
        "narrow": "hist_categories is not as wide as hist_items (its leading column states 4, against 7)",
    }
    want = loaded.run("serving_default", definition, good)
    for name, bad in (("unled", unled), ("narrow", narrow)):
        got, answer = _merged_answers(loaded, "serving_default", [good, bad])
        np.testing.assert_allclose(got["probability"], want["probability"], rtol=0, atol=ULPS)
        assert list(got["error"]) == [b"", b""]
        for outputs in (answer, loaded.run("serving_default", definition, bad)):
            assert [e.decode() for e in outputs["error"]] == [expected[name]], name
            assert outputs["probability"].tolist() == [0.0]


@pytest.mark.xdist_group("rank_export")
def test_a_row_stating_more_than_it_sent_is_never_answered_wrong(export, rng):
    """Issue 59 (8): a T=3 row stating -9 is refused alone (9 is past the tensor's width) but answered
    when TF Serving's batcher merges it with a wider request: its request is padded with its own
    first value, -9, and negative history ids are padding by the signatures' contract, which a
    client may send inside a row. So the merged row cannot be told from an honest row holding
    padding; what this test holds is that its answer is the honest row's (docs/serving.md says why
    the acceptance differs)."""
    loaded = LoadedModel(export["base"], "dare")
    definition = loaded.signature_defs["serving_default"]
    t, c = _users(export, rng, [1], [1])[2:], _users(export, rng, [3], [1])[:2]
    honest = request_tensors(*t, *c)
    wide = {k: v.copy() for k, v in honest.items()}
    wide["hist_items"][:, 0] = wide["hist_categories"][:, 0] = -9
    alone = loaded.run("serving_default", definition, wide)
    assert [e.decode() for e in alone["error"]] == [
        "hist_items must start with a column of minus its width (-T for a [rows, T] input, as serving.client writes "
        "it); this row starts with -9"]
    longer = request_tensors(*_users(export, rng, [2], [2])[2:], *_users(export, rng, [50, 50], [1])[:2])
    _, merged = _merged_answers(loaded, "serving_default", [longer, wide])
    assert list(merged["error"]) == [b""]
    np.testing.assert_allclose(merged["probability"], loaded.run("serving_default", definition, honest)["probability"],
                               rtol=0, atol=ULPS)
