"""Undertraining warnings and the default validation schedule (numpy only: no training)."""

import numpy as np
import pytest

from dare_tf.training.diagnostics import (MIN_VALIDATIONS, auc_standard_error, default_eval_every, run_warnings,
                                          undertraining_warnings)


def test_default_schedule_is_the_papers_150_steps_or_five_validations():
    assert MIN_VALIDATIONS == 5
    assert default_eval_every(10_000) == 150 and default_eval_every(750) == 150
    assert default_eval_every(749) == 149 and default_eval_every(10) == 2 and default_eval_every(3) == 1
    for total in (1, 7, 111, 749, 890, 5000):
        assert total // default_eval_every(total) >= min(MIN_VALIDATIONS, total)


def test_auc_standard_error_matches_a_simulation():
    rng = np.random.default_rng(0)
    positives, negatives, shift = 200, 400, 0.8
    aucs = []
    for _ in range(1000):
        pos, neg = rng.normal(shift, 1, positives), rng.normal(0, 1, negatives)
        aucs.append((pos[:, None] > neg[None, :]).mean())
    aucs = np.array(aucs)
    assert auc_standard_error(aucs.mean(), positives, negatives) == pytest.approx(aucs.std(), rel=0.1)
    assert np.isnan(auc_standard_error(0.7, 0, 10))


def _history(aucs, every=10):
    return [{"step": every * (i + 1), "val": {"auc": a}} for i, a in enumerate(aucs)]


def test_a_converged_run_raises_no_warning():
    assert undertraining_warnings(_history([0.60, 0.70, 0.74, 0.75, 0.74, 0.73]), 60, 1000, 2000) == []


def test_each_warning_on_its_history():
    one = undertraining_warnings(_history([0.61]), 5, 1000, 2000)
    assert one == ["1 validation (fewer than 5): too few to see convergence; validate more often (--eval_every) "
                   "or train longer (--epochs)"]
    improving = undertraining_warnings(_history([0.60, 0.65, 0.70, 0.72, 0.75]), 50, 1000, 2000)
    assert improving == ["the best validation is the last one (step 50 of 50): still improving, train longer "
                         "(--epochs)"]
    flat = undertraining_warnings(_history([0.600, 0.620, 0.615, 0.610, 0.612]), 50, 100, 200)
    noise = 2 * auc_standard_error(0.600, 100, 200)
    assert flat == [f"the best validation AUC 0.6200 is within noise (2 standard errors, {noise:.4f}) of the first "
                    "one 0.6000 (step 10): no measurable learning after it"]
    # The same gain on a split 100x larger is measurable.
    assert undertraining_warnings(_history([0.600, 0.620, 0.615, 0.610, 0.612]), 50, 10_000, 20_000) == []
    assert undertraining_warnings([], 5, 10, 10) == ["no validation in 5 steps"]
    assert run_warnings([{"seed": 3, "warnings": ["a"]}, {"seed": 4}]) == ["seed 3: a"]


def test_a_schedule_too_short_to_train_is_named_with_a_batch_size_that_is_not():
    from dare_tf.training.diagnostics import schedule_warnings

    assert schedule_warnings(50, 51200, 2048, 2) == []
    # a small log of one's own at the paper's batch of 2048 and 2 epochs: 8 steps
    assert schedule_warnings(8, 8500, 2048, 2) == [
        "the schedule gives 8 training steps (8500 examples, batch 2048, 2 epochs; fewer than 50): too few to train "
        "a model; lower --batch_size (--batch_size=256: 66 steps) or raise --epochs"]
    assert schedule_warnings(0, 10, 2048, 1)[0].endswith("lower --batch_size (--batch_size=1: 10 steps) or raise "
                                                           "--epochs")
