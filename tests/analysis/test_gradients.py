"""Gradient domination and conflict: the split sums to the gradient; recording changes nothing."""

import numpy as np
import pytest
import tensorflow as tf

import dare_tf
from dare_tf.analysis import gradients
from dare_tf.optimizers import make_optimizer
from tests.conftest import random_batch


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

    recorder = gradients.SplitGradientRecorder(batch_at, gradients.trajectory_steps(4, 2) + [2])
    plain.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0)
    recorded.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[recorder])
    for a, b in zip(plain.weights, recorded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert [s["step"] for s in recorder.samples] == [0, 2, 3]
    expected = gradients.path_statistics(gradients.split_gradients(reference, *batch_at(0))[1])["category"]
    got = recorder.samples[0]["statistics"]["category"]
    np.testing.assert_allclose(got["cosines"], expected["cosines"], rtol=1e-5)
    assert got["attention_norm"] == pytest.approx(expected["attention_norm"], rel=1e-5)
    assert np.all(np.abs(recorder.samples[1]["statistics"]["category"]["cosines"]) <= 1 + 1e-6)


def test_trajectory_steps_spread_over_the_whole_run_and_summaries_follow_them():
    assert gradients.trajectory_steps(1000, 5) == [0, 250, 500, 749, 999]
    assert gradients.trajectory_steps(3, 21) == [0, 1, 2]
    stats = lambda rep, att: {"category": {"representation_norm": rep, "attention_norm": att,  # noqa: E731
                                           "cosines": None, "rows": None}}
    samples = [{"step": 0, "statistics": stats(8700.0, 1.0)}, {"step": 500, "statistics": stats(60.0, 1.0)},
               {"step": 999, "statistics": stats(6.0, 1.0)}]
    out = gradients.summarize(samples, total_steps=1000)
    assert out["fractions"] == [0.0, 500 / 999, 1.0] and out["norm_ratios"] == [8700.0, 60.0, 6.0]
    assert out["norm_ratio"] == 60.0 and out["final_norm_ratio"] == 6.0 and out["conflict_share"] is None


def test_the_papers_gradient_statistics_read_its_steps_and_all_rows():
    """Domination: each path's mean row norm over all the table's rows, averaged over
    the first 100 steps, then their ratio (not the median of per-step ratios);
    conflict: the share of the read steps whose mean per-row cosine is negative."""
    from dare_tf.analysis.gradients import paper_steps, summarize_paper

    assert paper_steps(5) == [0, 1, 2, 3, 4]
    steps = paper_steps(5000)
    assert steps[:100] == list(range(100)) and steps[-1] == 4999 and len(steps) <= 1100

    def sample(step, attention, representation, cosines):
        return {"step": step, "statistics": {"category": {
            "attention_mean_row_norm": attention, "representation_mean_row_norm": representation,
            "cosines": None if cosines is None else np.array(cosines)}}}

    samples = [sample(0, 1.0, 10.0, [-0.5, 0.1]), sample(50, 3.0, 2.0, [0.2, 0.3]),
               sample(150, 100.0, 1.0, [-0.9])]  # (step 150 is past the first 100: no domination weight)
    paper = summarize_paper(samples)
    assert paper["norm_ratio"] == pytest.approx((10.0 + 2.0) / (1.0 + 3.0))  # 3, where the median ratio is 5.33
    assert paper["conflict_share"] == pytest.approx(2 / 3) and paper["domination_steps"] == 2
    decoupled = summarize_paper([sample(0, 1.0, 2.0, None)])
    assert decoupled["conflict_share"] is None and decoupled["norm_ratio"] == 2.0


def test_the_mean_row_norm_counts_every_row_of_the_table(rng):
    """`path_statistics`' mean row norm: per path, the gradient rows summed per table
    row, their norms summed and divided by all the table's rows (untouched rows: 0)."""
    x = {k: v.astype("int32") for k, v in random_batch(rng, 32, 12, 60, 8).items()}
    y = rng.integers(0, 2, 32).astype("float32")
    _, paths, _ = gradients.split_gradients(_twin(), x, y)
    stats = gradients.path_statistics(paths)["category"]
    for path in ("attention", "representation"):
        total, rows = {}, None
        for key, entry in paths.items():
            if key.endswith("/category"):
                rows = entry["table"].shape[0]
                values = entry[path].numpy().reshape(-1, entry[path].shape[-1])
                for row, value in zip(np.asarray(entry["ids"]).reshape(-1).tolist(), values):
                    total[row] = total.get(row, 0) + value
        expected = sum(np.linalg.norm(v) for v in total.values()) / rows
        assert stats[f"{path}_mean_row_norm"] == pytest.approx(expected, rel=1e-5) and rows == 8
