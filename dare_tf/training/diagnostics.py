"""Whether a run trained long enough: its validation schedule and the warnings
a finished seed's validation history raises.

A run validates every `eval_every` steps; by default (`eval_every=None`) that
is the paper's 150 steps, or fewer where the run is short, so that every run
validates at least `MIN_VALIDATIONS` times. A finished seed's history raises a
warning when

- it holds fewer than `MIN_VALIDATIONS` validations (no curve to judge
  convergence by);
- its best validation is its last one (still improving: train longer);
- its best validation AUC is within noise of its first (two standard errors of
  the first AUC, Hanley and McNeil's estimate for the split's positives and
  negatives): the run learned nothing measurable after its first validation.

The warnings are recorded in `results.json` (`warnings`, and per seed) and
printed at the end of the run.
"""

from __future__ import annotations

import math

MIN_VALIDATIONS = 5
MIN_TRAINING_STEPS = 50  # a schedule with fewer steps is too short to train (schedule_warnings)
PAPER_EVAL_EVERY = 150  # the reference's validation interval, in steps


def default_eval_every(total_steps: int) -> int:
    """The paper's 150 steps, or fewer so that a run of `total_steps` validates
    at least `MIN_VALIDATIONS` times."""
    return max(1, min(PAPER_EVAL_EVERY, total_steps // MIN_VALIDATIONS))


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil's (1982) standard error of an AUC measured on
    `positives` and `negatives` examples."""
    if positives < 1 or negatives < 1:
        return float("nan")
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc)
                + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return math.sqrt(max(variance, 0.0))


def split_labels(spec, split: str) -> tuple[int, int]:
    """Positives and negatives of a prepared split: each positive has the
    protocol's `negatives` sampled negatives."""
    count = spec.counts[split]
    negatives = int(spec.protocol.get("negatives", 1))
    positives = count // (1 + negatives)
    return positives, count - positives


def undertraining_warnings(history: list[dict], total_steps: int, positives: int, negatives: int) -> list[str]:
    """The warnings a seed's validation history (`history.jsonl` entries:
    `step`, `val`) raises; none for a run that converged."""
    if not history:
        return [f"no validation in {total_steps} steps"]
    out = []
    if len(history) < MIN_VALIDATIONS:
        out.append(f"{len(history)} validation{'s' if len(history) > 1 else ''} (fewer than {MIN_VALIDATIONS}): "
                   f"too few to see convergence; validate more often (--eval_every) or train longer (--epochs)")
    if len(history) > 1:
        aucs = [h["val"]["auc"] for h in history]
        best = max(range(len(aucs)), key=aucs.__getitem__)
        if best == len(aucs) - 1:
            out.append(f"the best validation is the last one (step {history[-1]['step']} of {total_steps}): "
                       f"still improving, train longer (--epochs)")
        noise = 2 * auc_standard_error(aucs[0], positives, negatives)
        if aucs[best] - aucs[0] < noise:
            out.append(f"the best validation AUC {aucs[best]:.4f} is within noise (2 standard errors, {noise:.4f}) "
                       f"of the first one {aucs[0]:.4f} (step {history[0]['step']}): no measurable learning after it")
    return out


def seed_warnings(history: list[dict], total_steps: int, spec) -> list[str]:
    """`undertraining_warnings` of a seed trained on the prepared dataset `spec`."""
    return undertraining_warnings(history, total_steps, *split_labels(spec, "val"))


def schedule_warnings(steps: int, examples: int, batch_size: int, epochs: int) -> list[str]:
    """A warning when the schedule itself (`epochs` over `examples` at
    `batch_size`, no `max_steps`) gives fewer than `MIN_TRAINING_STEPS` steps:
    the paper's batch of 2048 on a small log of one's own."""
    if steps >= MIN_TRAINING_STEPS:
        return []
    suggested = max(1, examples * epochs // MIN_TRAINING_STEPS)
    suggested = 1 << (suggested.bit_length() - 1)  # a power of two at or below it
    return [f"the schedule gives {steps} training steps ({examples} examples, batch {batch_size}, {epochs} epochs; "
            f"fewer than {MIN_TRAINING_STEPS}): too few to train a model; lower --batch_size (--batch_size="
            f"{suggested}: {examples * epochs // suggested} steps) or raise --epochs"]


def run_warnings(per_seed: list[dict]) -> list[str]:
    """Every seed's warnings, each prefixed by its seed."""
    return [f"seed {r['seed']}: {w}" for r in per_seed for w in r.get("warnings", [])]
