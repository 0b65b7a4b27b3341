"""The analysis suite: each computation against a brute-force or hand-computed
reference, the gradient split against plain training, and the program end to end."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import dare_tf
from dare_tf.analysis import attention, gradients, representation, retrieval
from dare_tf.optimizers import make_optimizer
from tests.conftest import REPO, random_batch

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)


def test_mutual_information_matches_a_brute_force_count(rng):
    from sklearn.metrics import mutual_info_score

    n, length, cats = 400, 6, 4
    tc = rng.integers(1, cats, n)
    hc = rng.integers(0, cats, (n, length))
    # The label depends on "target's category at position 1", so some cells carry information.
    y = ((hc[:, -1] == tc) | (rng.random(n) < 0.3)).astype(float)
    counts = attention.CooccurrenceCounts.from_examples(tc, hc, y, cats)
    checked = 0
    for t in range(1, cats):
        rows = tc == t
        for c in range(1, cats):
            for p in range(1, length + 1):
                present = hc[rows, length - p] == c
                x_pos = int((present & (y[rows] == 1)).sum())
                x_neg = int((present & (y[rows] == 0)).sum())
                assert counts.lookup(t, c, p) == (x_pos, x_neg)
                # (A zero count is smoothed to 1e-5 as in the paper's analysis; compare the rest.)
                if x_pos and x_neg and present.sum() < rows.sum():
                    expected = mutual_info_score(y[rows], present) / np.log(2)  # bits
                    assert counts.mutual_information(t, c, p) == pytest.approx(expected, abs=1e-9)
                    checked += 1
    assert checked > 50
    assert counts.target_positives[1] == int(y[tc == 1].sum())
    # Vectorised over broadcast index arrays, the same numbers.
    grid = counts.mutual_information(np.array([1, 2])[:, None, None], np.arange(1, cats)[None, :, None],
                                     np.arange(1, length + 1)[None, None, :])
    assert grid.shape == (2, cats - 1, length)
    assert grid[1, 0, 2] == pytest.approx(counts.mutual_information(2, 1, 3))


def test_ndcg_against_a_hand_computed_case():
    gains = np.array([[3.0, 2.0, 0.0, 1.0, 5.0]])
    scores = np.array([[0.9, 0.1, 0.8, 0.5, 0.0]])
    valid = np.array([[True, True, True, True, False]])  # the 5.0 slot is padding: never counted
    # Ranked by score: slots 0 (3), 2 (0), 3 (1); ideal: 3, 2, 1.
    dcg = 3 / np.log2(2) + 0 / np.log2(3) + 1 / np.log2(4)
    idcg = 3 / np.log2(2) + 2 / np.log2(3) + 1 / np.log2(4)
    assert retrieval.ndcg_at_k(gains, scores, valid, 3)[0] == pytest.approx(dcg / idcg)
    # The perfect ranking gives 1; no gain at all gives NaN (left out of means).
    assert retrieval.ndcg_at_k(gains, gains, valid, 3)[0] == pytest.approx(1.0)
    assert np.isnan(retrieval.ndcg_at_k(np.zeros((1, 5)), scores, valid, 3)[0])
    summary = retrieval.mean_with_interval(np.array([0.5, np.nan, 0.7]))
    assert summary["count"] == 2 and summary["mean"] == pytest.approx(0.6)


def test_planted_gains_follow_the_generator_truth():
    truth = {"per_lag": [{"lag": 1, "p_same_category": 0.6, "p_related_category": 0.1},
                         {"lag": 2, "p_same_category": 0.4, "p_related_category": 0.05}],
             "related_category": [0, 2, 1, 4, 3]}
    gains = retrieval.planted_gains(truth, [1, 3], [[2, 1], [0, 3]])
    # Target 1: slot 0 (lag 2) holds its related category 2, slot 1 (lag 1) the same category.
    np.testing.assert_allclose(gains, [[0.05, 0.6], [0.0, 0.6]])


def test_learned_category_position_scores_are_the_search_scores_without_items(rng):
    model = dare_tf.build_model("dare", 50, 6, max_len=8, top_k=3, seed=0)
    attention_items = model.embedding.tables["attention"]["item"]
    attention_items.assign(np.zeros(attention_items.shape, "float32"))
    x = random_batch(rng, 5, 8, 50, 6, lengths=[8] * 5)
    ids = model._unpack(x)
    expected = model.slot_scores(model.embedding.combine(model.embedding.lookup(*ids)), ids).numpy()
    for b in range(5):
        for j in (0, 4, 7):
            got = attention.category_position_scores(model, [x["target_category"][b]], [x["hist_categories"][b, j]],
                                                     [8 - j])
            assert got[0, 0, 0] == pytest.approx(expected[b, j], rel=1e-5, abs=1e-7)


def _twin(jit=False):
    model = dare_tf.build_model("twin", 60, 8, max_len=12, top_k=4, seed=1, jit_compile_dense=jit)
    model.compile(optimizer=make_optimizer("adam", 0.01))
    model.optimizer.build(model.trainable_variables)
    return model


def test_gradient_split_sums_to_the_gradient_and_recording_during_fit_changes_nothing(rng):
    batches = []
    for _ in range(4):
        x = {k: v.astype("int32") for k, v in random_batch(rng, 32, 12, 60, 8).items()}
        batches.append((x, rng.integers(0, 2, 32).astype("float32")))
    model = _twin()
    x, y = batches[0]
    with tf.GradientTape() as tape:
        loss = model.loss_terms(y, model.forward(x, training=True))["total"]
    full = dict(zip([v.path for v in model.trainable_variables], tape.gradient(loss, model.trainable_variables)))
    model = _twin()  # (the forward above moved BatchNorm's statistics)
    split_loss, paths, dense = gradients.split_gradients(model, x, y)
    assert float(split_loss) == pytest.approx(float(loss), rel=1e-6)
    both = [k for k, e in paths.items() if float(tf.reduce_sum(tf.abs(e["attention"]))) > 0
            and float(tf.reduce_sum(tf.abs(e["representation"]))) > 0]
    assert both, "shared tables: some rows get gradient through both paths"
    for g, table in gradients.table_gradients(paths):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(full[table.path]).numpy(),
                                   atol=1e-9)
    for g, v in dense:
        np.testing.assert_allclose(g.numpy(), tf.convert_to_tensor(full[v.path]).numpy(), atol=1e-9)

    # Recording during the model's own fit changes no weight, and records what
    # split_gradients gives on that step's batch.
    xs = {k: np.concatenate([x[k] for x, _ in batches]) for k in batches[0][0]}
    ys = np.concatenate([y for _, y in batches])
    plain, recorded, reference = _twin(), _twin(), _twin()

    def batch_at(step):
        return {k: v[step * 32:(step + 1) * 32] for k, v in xs.items()}, ys[step * 32:(step + 1) * 32]

    recorder = gradients.SplitGradientRecorder(batch_at, every=2)
    plain.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0)
    recorded.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[recorder])
    for a, b in zip(plain.weights, recorded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert [s["step"] for s in recorder.samples] == [0, 2]
    expected = gradients.path_statistics(gradients.split_gradients(reference, *batch_at(0))[1])["category"]
    got = recorder.samples[0]["statistics"]["category"]
    np.testing.assert_allclose(got["cosines"], expected["cosines"], rtol=1e-5)
    assert got["attention_norm"] == pytest.approx(expected["attention_norm"], rel=1e-5)
    assert np.all(np.abs(recorder.samples[1]["statistics"]["category"]["cosines"]) <= 1 + 1e-6)


def test_cluster_information_is_deterministic_and_finds_separable_labels(rng):
    x = np.concatenate([rng.normal(0, 0.1, (100, 3)), rng.normal(5, 0.1, (100, 3))])
    y = np.repeat([0, 1], 100)
    first = representation.cluster_label_information(x, y, [2, 10], seed=3)
    assert first == representation.cluster_label_information(x, y, [2, 10], seed=3)
    assert first[2] == pytest.approx(np.log(2), rel=1e-6)  # two clusters = the two labels
    ks = representation.default_cluster_counts(4000)
    assert ks[0] == 10 and ks[-1] == 800 and ks == sorted(set(ks))


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """Two short runs on a small planted log, and the whole suite on them."""
    from dare_tf.analysis.suite import AnalysisConfig, run_analyses
    from dare_tf.data.protocol import Protocol, prepare
    from dare_tf.data.synthetic import SyntheticConfig, write
    from dare_tf.training import TrainConfig, train

    root = tmp_path_factory.mktemp("analysis")
    log = str(root / "log.csv")
    write(SyntheticConfig(users=500, items=1500, categories=30, min_length=60, max_length=120, seed=3), log)
    data = str(root / "prepared")
    prepare("taobao", log, data, Protocol(min_clicks=50, max_len=30, train_targets=6))
    runs = {}
    for preset in ("dare", "twin"):
        runs[preset] = str(root / preset)
        train(data, runs[preset], TrainConfig.create(preset=preset, batch_size=256, eval_batch_size=1024, epochs=1,
                                              eval_every=5, max_steps=15, jit_compile=False, verbose=0,
                                              model_overrides=dict(top_k=5)))
    out = str(root / "out")
    config = AnalysisConfig(gradient_steps=12, gradient_every=4, attention_dims=(16, 8), kmeans_examples=600,
                            min_target_examples=10, positions=5, top_categories=6)
    result = run_analyses(data, runs, out, config, dimension_runs={16: runs["dare"]}, report=lambda _: None)
    return data, runs, out, result


@pytest.mark.slow
def test_the_suite_writes_every_number_figure_and_the_report_and_refuses_bad_input(analysed, tmp_path):
    """One test for the module's expensive fixture (pytest rebuilds a module fixture
    on each xdist worker that runs a test using it)."""
    data, runs, out, result = analysed
    saved = json.load(open(os.path.join(out, "analysis.json")))
    for key in ("attention", "retrieval", "gradients", "representation", "convergence", "dimensions"):
        assert key in saved
    assert set(saved["retrieval"]["ndcg"]) == {"dare", "twin"}
    assert all(0 <= v <= 1 for v in saved["retrieval"]["ndcg"].values())
    assert set(saved["retrieval"]["planted"]["ndcg"]) == {"dare", "twin"}  # the synthetic log's truth
    assert saved["gradients"]["model"] == "twin" and saved["gradients"]["norm_ratio"] > 0
    assert 0 <= saved["gradients"]["conflict_share"] <= 1
    assert saved["gradients"]["by_model"]["dare"]["conflict_share"] is None  # decoupled: no shared rows
    assert [r["attention_dim"] for r in saved["dimensions"]["rows"]] == [8, 16]
    assert saved["convergence"]["steps_to_reference_best"]["twin"] is not None
    report = open(os.path.join(out, "report.md")).read()
    for name, path in saved["figures"].items():
        full = os.path.join(out, path)
        with open(full, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
        assert os.path.getsize(full) > 5000, name
        assert f"]({path})" in report, name
    # The trainer drew each run's curves.
    with open(os.path.join(runs["dare"], "curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    _program_errors(data, runs, tmp_path)


def _program_errors(data, runs, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")

    def analyze(*args):
        return subprocess.run([sys.executable, "-m", "trainers.analyze", f"--data_dir={data}", *args],
                              cwd=REPO, env=ENV, capture_output=True, text=True)

    done = analyze(f"--runs=dare:{runs['dare']}", f"--output_dir={foreign}", "--analyses=convergence")
    assert done.returncode == 1 and "notes.txt" in done.stderr and "did not write" in done.stderr
    assert (foreign / "notes.txt").read_text() == "keep me"
    done = analyze("--runs=dare", f"--output_dir={tmp_path / 'a'}")
    assert done.returncode == 2 and "'dare' is not label:run_dir" in done.stderr
    from dare_tf.analysis.suite import run_analyses

    with pytest.raises(FileNotFoundError, match="run_config.json not found"):
        run_analyses(data, {"dare": str(tmp_path)}, str(tmp_path / "b"), analyses=("convergence",))
    with pytest.raises(ValueError, match=r"unknown \['speed'\]"):
        run_analyses(data, runs, str(tmp_path / "c"), analyses=("speed",))
