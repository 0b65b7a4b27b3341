"""The cascade evaluation, in a process of its own (`own_process`)."""

import json
import os

import numpy as np
import pytest

from tests.conftest import REPO

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
pytestmark = pytest.mark.own_process


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
