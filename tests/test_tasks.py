"""ClickTask, the loss: click + auxiliary cross entropy + L2, against numpy."""

import numpy as np
import pytest

from dare_tf.tasks import ClickTask


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
