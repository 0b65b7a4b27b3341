"""The TFRS retrieval stage, each check in a process of its own (TFRS needs tf.keras
to be Keras 2, resolved once per process)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
if importlib.util.find_spec("tensorflow_recommenders") is None:  # (importing it here would resolve tf.keras)
    pytest.skip("tensorflow-recommenders is not installed", allow_module_level=True)


def _python(script, timeout=600):
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def test_factorized_top_k_recall_and_the_index_match_numpy_and_keras3_coexists():
    script = r'''
import json, numpy as np, dare_tf
from dare_tf.retrieval import TwoTowerModel, brute_force_index
import tensorflow as tf

def recall_at_k(q, c, ids, positives, ks):
    """Share of queries whose positive is among the k highest dot products."""
    scores = q @ c.T
    positive = scores[np.arange(len(positives)), np.searchsorted(ids, positives)]
    rank = (scores > positive[:, None]).sum(axis=1)
    return {f"recall@{k}": float((rank < k).mean()) for k in ks}

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
print(json.dumps({"got": got, "ref": ref, "same_top": bool((ids.numpy() == top).all()),
                  "keras3": keras.__version__.startswith("3"), "loss": loss}))
'''
    done = _python(script)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for k, v in out["ref"].items():
        assert out["got"][k] == pytest.approx(v, abs=1e-6), (k, out)
    assert 0 < out["ref"]["recall@20"] < 1
    assert out["same_top"] and out["keras3"] and out["loss"] > 0


def test_tf_keras_resolved_to_keras3_first_is_refused_with_the_fix():
    done = _python("import tensorflow as tf\ntf.keras.layers\nimport dare_tf.retrieval\n")
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


def test_exported_retrieval_returns_the_in_process_top_n(taobao, tmp_path):
    script = f'''
import json, numpy as np
from dare_tf.retrieval import RetrievalConfig, train_retrieval
from dare_tf.retrieval.export import export_retrieval, load_retrieval_model
from dare_tf.retrieval.training import catalogue
from dare_tf.retrieval.model import brute_force_index
from dare_tf.data.pipeline import InMemorySplit
from dare_tf.data.spec import DatasetSpec, read_id_map
import tensorflow as tf
data, run = {str(taobao)!r}, {str(tmp_path / "run")!r}
train_retrieval(data, run, RetrievalConfig(epochs=1, batch_size=256))
path = export_retrieval(run, data, {str(tmp_path / "exports")!r}, top_n=20)
spec = DatasetSpec.load(data)
splits = {{s: InMemorySplit.load(data, s, spec) for s in ("train", "val", "test")}}
items, cats = catalogue(spec, splits)
model = load_retrieval_model(run, spec, items, cats)
test = splits["test"].features
raw_items = np.array([0] + [int(r) for r in read_id_map(data, "item")], np.int64)
raw_cats = np.array([0] + [int(r) for r in read_id_map(data, "category")], np.int64)
hist_items, hist_cats = raw_items[test["hist_items"][:8]], raw_cats[test["hist_categories"][:8]]
hist_items[0, -1] = 987654321987  # an unknown raw id: the out-of-vocabulary row
out = tf.saved_model.load(path).signatures["serving_default"](
    hist_items=tf.constant(hist_items), hist_categories=tf.constant(hist_cats))
dense_items = test["hist_items"][:8].copy(); dense_items[0, -1] = spec.oov_item
scores, ids = brute_force_index(model, (items, cats), 20)({{"hist_items": dense_items,
                                                            "hist_categories": test["hist_categories"][:8]}})
category_of = dict(zip(items.tolist(), cats.tolist()))
print(json.dumps({{"same_items": bool((out["items"].numpy() == raw_items[ids.numpy()]).all()),
                  "same_scores": float(np.abs(out["scores"].numpy() - scores.numpy()).max()),
                  "categories_ok": bool((out["categories"].numpy() == raw_cats[[[category_of[i] for i in row]
                                                                               for row in ids.numpy()]]).all()),
                  "shape": list(out["items"].shape)}}))
'''
    done = _python(script)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["same_items"] and out["categories_ok"] and out["same_scores"] < 1e-5 and out["shape"] == [8, 20], out
