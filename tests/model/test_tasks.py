"""ClickTask, the loss: click + auxiliary cross entropy + L2, against numpy."""

import numpy as np
import pytest

from dare_tf.model.tasks import ClickTask


def test_click_task_terms_match_numpy(rng):
    y = rng.integers(0, 2, 16).astype("float32")
    p, aux, w = rng.uniform(0, 1, 16), rng.uniform(0, 1, 16), rng.uniform(0, 2, 16)

    def cross_entropy(q, weights=None):
        losses = -np.log(np.where(y > 0.5, q, 1 - q) + 1e-8)
        return np.mean(losses if weights is None else losses * weights)

    terms = {k: float(v) for k, v in ClickTask()(y, {"probability": p, "aux_probability": aux}, w, 0.25).items()}
    assert terms["click"] == pytest.approx(cross_entropy(p, w), rel=1e-5)
    assert terms["aux"] == pytest.approx(cross_entropy(aux, w), rel=1e-5)
    assert terms["total"] == pytest.approx(cross_entropy(p, w) + cross_entropy(aux, w) + 0.25, rel=1e-5)
    alone = ClickTask()(y, {"probability": p})
    assert float(alone["aux"]) == 0 and float(alone["regularization"]) == 0
    assert float(alone["total"]) == pytest.approx(cross_entropy(p), rel=1e-5)
    # p = 0 for a click is -log(1e-8), finite (the reference's epsilon)
    assert float(ClickTask()(np.ones(1), {"probability": np.zeros(1)})["click"]) == pytest.approx(-np.log(1e-8))


def test_group_softmax_loss_matches_numpy(rng):
    group, groups = 5, 6
    p = rng.uniform(0.01, 0.99, group * groups)
    y = np.tile(np.eye(1, group)[0], groups)
    y[group + 2] = 1.0  # a group with two clicks: each gets half the target mass
    w = rng.uniform(0.5, 2, group * groups)
    logits = (np.log(p) - np.log(1 - p)).reshape(groups, group)
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    target = y.reshape(groups, group) / y.reshape(groups, group).sum(1, keepdims=True)
    losses = -(target * log_softmax).sum(1)
    weights = (w.reshape(groups, group) * target).sum(1)
    task = ClickTask(group=group)
    assert float(task(y, {"probability": p})["click"]) == pytest.approx(losses.mean(), rel=1e-5)
    assert float(task(y, {"probability": p}, w)["click"]) == pytest.approx((losses * weights).mean(), rel=1e-5)
    terms = task(y, {"probability": p, "aux_probability": p[::-1].copy()}, None, 0.5)
    assert float(terms["total"]) == pytest.approx(float(terms["click"]) + float(terms["aux"]) + 0.5, rel=1e-6)
    # saturated probabilities stay finite (1 - 1e-8 is 1 in float32)
    saturated = task(y, {"probability": np.where(y > 0, 1.0, 0.0).astype("float32")})["click"]
    assert float(saturated) == pytest.approx(np.log(2) / groups, rel=1e-4)  # (the two-click group: log 2)
    with pytest.raises(ValueError, match=r"^group=1: a softmax over a click and its negatives needs >= 2 examples$"):
        ClickTask(group=1)
