"""Convergence: validation metrics against training steps, from the runs'
history files (no retraining)."""

from __future__ import annotations

import numpy as np


def validation_curves(histories: list[list[dict]]) -> dict:
    """Mean over seeds of validation AUC and logloss per step (the steps every
    seed evaluated): `{"steps": [...], "auc": [...], "logloss": [...]}`."""
    common = sorted(set.intersection(*[{h["step"] for h in history} for history in histories]))
    out = {"steps": common}
    for metric in ("auc", "logloss"):
        out[metric] = [float(np.mean([next(h["val"][metric] for h in history if h["step"] == step)
                                      for history in histories])) for step in common]
    return out


def steps_to_reach(curves: dict, target_auc: float):
    """The first step whose validation AUC reaches `target_auc`, or None."""
    return next((step for step, auc in zip(curves["steps"], curves["auc"]) if auc >= target_auc), None)
