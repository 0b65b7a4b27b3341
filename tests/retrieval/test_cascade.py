"""The cascade evaluation."""

import json
import os

import numpy as np
import pytest


@pytest.mark.slow
@pytest.mark.own_process  # tensorflow-recommenders: tf.keras as Keras 2
def test_cascade_evaluation_matches_the_retrieval_recall_and_a_per_example_reference(taobao, two_stage, tmp_path):
    from dare_tf.retrieval import evaluate_cascade  # noqa: I001
    from dare_tf.retrieval.cascade import rerank
    data, work = taobao, str(tmp_path)
    with open(os.path.join(two_stage["retrieval"], "results.json")) as f:
        retrieval = json.load(f)
    out = evaluate_cascade(data, two_stage["retrieval"], {"dare": two_stage["dare"]},
                           os.path.join(work, "cascade"), num_candidates=200, k=10, report=lambda s: None)
    import keras
    model = keras.models.load_model(os.path.join(two_stage["dare"], "seed_0", "model.keras"))
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
        evaluate_cascade(data, two_stage["retrieval"], {"dare": two_stage["dare"]},
                         os.path.join(work, "cascade"), num_candidates=100, k=10, report=lambda s: None)
        refused = None
    except ValueError as e:
        refused = str(e)
    # The retrieval run refuses other flags; its export refuses a top_n over the catalogue.
    from dare_tf.export import export_run
    from dare_tf.retrieval import RetrievalConfig, train_retrieval
    refusals = {}
    for name, call in {"epochs": lambda: train_retrieval(data, two_stage["retrieval"], RetrievalConfig(epochs=3,
                                                                                                      batch_size=256)),
                       "top_n": lambda: export_run(two_stage["retrieval"], os.path.join(work, "exports"),
                                                   "retrieval", top_n=999999)}.items():
        try:
            call()
        except ValueError as e:
            refusals[name] = str(e)
    # The program writes the same evaluation, quietly (a user's environment).
    import subprocess
    import sys

    from tests.conftest import LOUD_ENV, REPO, noise
    done = subprocess.run([sys.executable, "-m", "trainers.evaluate_cascade", f"--data_dir={data}",
                           f"--retrieval_run={two_stage['retrieval']}", f"--ranking_runs=dare:{two_stage['dare']}",
                           f"--output_dir={os.path.join(work, 'program')}"], cwd=REPO, env=LOUD_ENV,
                          capture_output=True, text=True, timeout=600)
    program = {"code": done.returncode, "stderr": done.stderr[-3000:], "noise": noise(done.stdout + done.stderr),
               "same": os.path.exists(os.path.join(work, "program", "cascade.json")) and json.load(
                   open(os.path.join(work, "program", "cascade.json"))) == out}
    out = json.loads(json.dumps({"program": program, "refusals": refusals, "cascade": out,
                                 "retrieval": retrieval["test"], "sources": retrieval["test_sources"],
                                 "reordered": reordered.tolist(), "reference": reference, "refused": refused,
                                 "written": json.load(open(os.path.join(work, "cascade", "cascade.json"))) == out}))
    cascade, tfrs_recall = out["cascade"], out["retrieval"]
    assert cascade["examples"] == 86
    # The cascade's candidates are the run's merged candidates: retrieval's HitRate@10 is
    # the run's recall@10, and each source's recall@200 the run's.
    assert cascade["retrieval"]["hit_rate@10"] == pytest.approx(tfrs_recall["recall@10"], abs=1e-6)
    assert cascade["retrieval"]["recall@200"] == pytest.approx(tfrs_recall["recall@200"], abs=1e-6)
    for name, recall in out["sources"].items():
        assert cascade["sources"][name]["recall@200"] == pytest.approx(recall["recall@200"], abs=1e-6), name
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
    assert "retrieval_config.epochs: 2 in the run, 3 now" in out["refusals"]["epochs"], out["refusals"]
    assert "top_n=999999 is larger than the catalogue" in out["refusals"]["top_n"], out["refusals"]
    assert out["program"]["code"] == 0 and out["program"]["same"] and not out["program"]["noise"], out["program"]
    assert "holds a cascade evaluation of another configuration" in out["refused"]
