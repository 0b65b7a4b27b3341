"""The cascade evaluation."""

import json
import os

import numpy as np
import pytest


@pytest.mark.slow
@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
@pytest.mark.xdist_group("two_stage")  # (one worker trains the two-stage runs)
def test_cascade_evaluation_matches_the_retrieval_recall_and_a_per_example_reference(taobao, two_stage, tmp_path):
    from dare_tf.retrieval import evaluate_cascade
    from dare_tf.reranking import rerank
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
    replaced = evaluate_cascade(data, two_stage["retrieval"], {"dare": two_stage["dare"]},
                                os.path.join(work, "cascade"), num_candidates=100, k=10, report=lambda s: None,
                                overwrite=True)
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
                                 "replaced": replaced["config"]["num_candidates"],
                                 "written": json.load(open(os.path.join(work, "cascade", "cascade.json")))
                                 == json.loads(json.dumps(replaced))}))
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
    # The verdict: each order of the same candidates with standard errors and its paired
    # difference from the retrieval order; a warning exactly when a ranker does not beat
    # the retrieval order by more than two standard errors.
    n = cascade["examples"]
    for order in (cascade["retrieval"], cascade["popularity_order"], dare):  # a hit rate p's: sqrt(p(1-p)/(n-1))
        p = order["hit_rate@10"]
        assert order["hit_rate@10_se"] == pytest.approx(np.sqrt(p * (1 - p) / (n - 1)))
        assert order["ndcg@10_se"] >= 0
    assert cascade["retrieval"]["hit_rate@10_vs_retrieval"] == 0
    assert dare["hit_rate@10_vs_retrieval"] == pytest.approx(dare["hit_rate@10"] - cascade["retrieval"]["hit_rate@10"])
    beaten = dare["hit_rate@10_vs_retrieval"] > 2 * dare["hit_rate@10_vs_retrieval_se"]
    assert beaten == (not any(w.startswith("dare ") for w in cascade["warnings"])), cascade["warnings"]
    # The batched order is the one-at-a-time probabilities' order (ties within float
    # noise of the batch size may swap).
    for reordered, probability in zip(out["reordered"], out["reference"]):
        p = [probability[str(c)] for c in reordered]
        assert sorted(reordered) == sorted(int(c) for c in probability)
        assert all(a >= b - 1e-6 for a, b in zip(p, p[1:])), p
    assert out["written"] and out["replaced"] == 100  # overwrite=True replaced the file of another configuration
    assert "retrieval_config.epochs: 2 in the run, 3 now" in out["refusals"]["epochs"], out["refusals"]
    assert "top_n=999999 is larger than the catalogue" in out["refusals"]["top_n"], out["refusals"]
    assert out["program"]["code"] == 0 and out["program"]["same"] and not out["program"]["noise"], out["program"]
    assert "holds a cascade evaluation of another configuration" in out["refused"]
    assert out["refused"].endswith("choose another --output_dir, or --overwrite to replace it")


@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
def test_the_cascade_verdict_names_what_does_not_pay_off():
    from dare_tf.retrieval.cascade import format_cascade
    from dare_tf.retrieval.verdict import cascade_warnings

    def order(hit, difference, se):
        return {"hit_rate@10": hit, "hit_rate@10_se": 0.01, "ndcg@10": hit / 2, "ndcg@10_se": 0.01,
                "hit_rate@10_vs_retrieval": difference, "hit_rate@10_vs_retrieval_se": se}

    results = {"config": {"k": 10, "num_candidates": 200}, "examples": 100, "catalogue": 1000,
               "retrieval": dict(order(0.14, 0.0, 0.0), **{"recall@200": 0.35}),
               "popularity_order": order(0.05, -0.09, 0.01),
               "quotas": {"two_tower": 0.0, "popularity": 0.5, "recent_categories": 0.5},
               "sources": {"two_tower": {"recall@200": 0.30}, "popularity": {"recall@200": 0.17},
                           "recent_categories": {"recall@200": 0.33}},
               "rankers": {"below": order(0.07, -0.07, 0.008), "noise": order(0.15, 0.01, 0.008),
                           "better": order(0.20, 0.06, 0.008)}}
    warnings = cascade_warnings(results)
    assert warnings == [
        "below ranks below the retrieval order beyond noise: HitRate@10 0.0700 vs 0.1400 (difference -0.0700 +/- "
        "0.0080, one standard error): reranking makes these recommendations worse; train the ranker on the candidates "
        "it ranks (trainers.train --negatives=uniform:8,retrieval:8 --retrieval_run=RUN, docs/two-stage.md)",
        "noise does not beat the retrieval order beyond noise: HitRate@10 0.1500 vs 0.1400 (difference +0.0100 +/- "
        "0.0080, one standard error): reranking makes these recommendations no better; train the ranker on the "
        "candidates it ranks (trainers.train --negatives=uniform:8,retrieval:8 --retrieval_run=RUN, docs/two-stage.md)",
        "the quotas give the two_tower source no candidates (quota 0, chosen on validation): the retrieval stage "
        "does not use it",
        "the two-tower's recall@200 (0.3000) is below the recent_categories source's (0.3300): the learned "
        "retrieval adds less than a heuristic"]
    table = format_cascade(dict(results, warnings=warnings)).splitlines()
    assert table[1] == "| order of the top-200 | HitRate@10 | NDCG@10 | HitRate@10 - retrieval's |"
    assert table[7] == "| better (reranked) | 0.2000 +/- 0.0100 | 0.1000 +/- 0.0100 | +0.0600 +/- 0.0080 |"
    assert table[-4:] == [f"warning: {w}" for w in warnings]
    # First-day issue (6): rankers shown for comparison (the demo's paper-trained runs) get a note saying
    # what their row shows, in the same line, instead of a warning to act on.
    from dare_tf.retrieval.verdict import cascade_notes

    assert cascade_warnings(results, baselines=("below", "noise")) == warnings[2:]
    notes = cascade_notes(results, ("below", "noise", "better"))
    assert notes == [
        "below (for comparison: not trained on the candidates it reorders) ranks below the retrieval order: HitRate@10 "
        "0.0700 vs 0.1400 (difference -0.0700 +/- 0.0080, one standard error)",
        "noise (for comparison: not trained on the candidates it reorders) ranks level with the retrieval order: "
        "HitRate@10 0.1500 vs 0.1400 (difference +0.0100 +/- 0.0080, one standard error)",
        "better (for comparison: not trained on the candidates it reorders) ranks above the retrieval order: "
        "HitRate@10 0.2000 vs 0.1400 (difference +0.0600 +/- 0.0080, one standard error)"]
    assert format_cascade(dict(results, warnings=[], notes=notes)).splitlines()[-3:] == [f"note: {n}" for n in notes]
    # a retrieval run alone (train_retrieval): its quotas and sources only
    assert cascade_warnings({"quotas": {"two_tower": 0.4, "popularity": 0.6},
                             "sources": {"two_tower": {"recall@200": 0.4}, "popularity": {"recall@200": 0.2}}}) == []


@pytest.mark.slow
@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
@pytest.mark.xdist_group("two_stage")  # (one worker trains the two-stage runs)
@pytest.mark.parametrize("engine", ["tensorflow", "jax"])
def test_a_ranker_trained_on_retrieval_negatives_reports_the_cascade_it_is_selected_by(engine, taobao, two_stage,
                                                                                       tmp_path):
    """--negatives=retrieval:N --retrieval_run --loss=softmax, on either engine (issue 66: on
    JAX without TensorFlow): negatives come from each training history's own retrieved
    candidates, which the retrieval run wrote; every validation reports the cascade's
    metrics, the kept weights are the best validation NDCG@10's, and the run's test cascade
    metrics are evaluate_cascade's for the same run."""
    import subprocess
    import sys

    from dare_tf.retrieval import evaluate_cascade
    from tests.conftest import REPO
    from tests.programs import run_program

    run = str(tmp_path / "cascade_ranker")
    flags = [f"--data_dir={taobao}", f"--output_dir={run}", "--model=dare", "--batch_size=250", "--epochs=1",
             "--eval_every=10", "--max_steps=30", "--verbose=0", "--top_k=10", "--negatives=retrieval:4",
             "--loss=softmax", f"--retrieval_run={two_stage['retrieval']}"]
    if engine == "tensorflow":
        run_program("trainers.train", *flags, "--nojit_compile", check=True)
    else:
        done = subprocess.run([sys.executable, "tests/no_tensorflow.py", "trainers.train", *flags], cwd=REPO,
                              env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(run, "results.json")) as f:
        results = json.load(f)
    assert json.load(open(os.path.join(run, "run_config.json")))["backend"] == engine
    history = [json.loads(line) for line in open(os.path.join(run, "seed_0", "history.jsonl"))]
    assert [h["step"] for h in history] == [10, 20, 30]
    best = max(history, key=lambda h: h["val"]["ndcg@10"])  # (ties: the first)
    assert results["per_seed"][0]["best_step"] == best["step"]
    cascade = evaluate_cascade(taobao, two_stage["retrieval"], {"ranker": run}, str(tmp_path / "cascade"),
                               report=lambda s: None)
    test = results["test_cascade"]
    assert test["hit_rate@10"] == pytest.approx(cascade["rankers"]["ranker"]["hit_rate@10"], abs=1e-9)
    assert test["ndcg@10"] == pytest.approx(cascade["rankers"]["ranker"]["ndcg@10"], abs=1e-9)
    assert test["retrieval_hit_rate@10"] == pytest.approx(cascade["retrieval"]["hit_rate@10"], abs=1e-9)
    if engine == "jax":
        return
    # the candidates the retrieval run wrote are the stage's, and the retrieval negatives of the
    # first epoch are among each history's first 200 of them
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.retrieval.training import RetrievalStage
    from dare_tf.training import TrainConfig
    from dare_tf.training.reranking import Cascade

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(negatives="retrieval:4", retrieval_run=two_stage["retrieval"], batch_size=250)
    memory = {"train": InMemorySplit.load(taobao, "train", spec)}
    loaded = Cascade.load(taobao, spec, config, spec.max_len, None, memory)
    sampler = loaded.sampler
    windows = dict(zip(("hist_items", "hist_categories"), loaded.store.windows(
        sampler.positives["uid"], sampler.positives["position"], spec.max_len)))
    table = RetrievalStage.load(taobao, two_stage["retrieval"]).candidates(windows, 200)
    np.testing.assert_array_equal(sampler.candidates, table)
    drawn = sampler.negatives(np.random.default_rng(0))
    assert all(set(row) <= set(candidates) for row, candidates in zip(drawn, table))
    assert (drawn != sampler.positives["target_item"][:, None]).all()
