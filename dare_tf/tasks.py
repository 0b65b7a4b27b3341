"""ClickTask: the training objective of the DARE family, as a task object.

In the shape of TensorFlow Recommenders' `tasks.Ranking`: the loss lives in
one object that the model's `compute_loss` calls, so `fit`, `evaluate`, the
distributed loop and the analyses compute the same objective.
"""

from __future__ import annotations

from keras import ops

# reference.md adds 1e-8 to the softmax output before the log.
LOG_EPSILON = 1e-8


def click_cross_entropy(labels, probability, sample_weight=None):
    """Two-class cross entropy as the reference computes it, `-log(p_label + 1e-8)`,
    averaged over the batch (Keras's `sum_over_batch_size`: `sum(w * l) / B`)."""
    labels = ops.reshape(ops.cast(labels, "float32"), (-1,))
    probability = ops.clip(ops.reshape(ops.cast(probability, "float32"), (-1,)), 0.0, 1.0)
    # Pick the label's probability first: written as y*log(p + e) + (1-y)*log(1 - p + e),
    # graph rewriting folds 1 + e to 1 and turns 0 * log(0) into NaN.
    chosen = ops.where(ops.greater(labels, 0.5), probability, 1.0 - probability)
    losses = -ops.log(chosen + LOG_EPSILON)
    if sample_weight is not None:
        losses = losses * ops.reshape(ops.cast(sample_weight, "float32"), (-1,))
    return ops.mean(losses)


class ClickTask:
    """Click cross entropy, plus the auxiliary head's, plus the L2 penalty.

    Call arguments:
        labels: `[B]` 0/1 clicks.
        outputs: the model's outputs: `probability` `[B]` and, with an
            auxiliary head, `aux_probability` `[B]`.
        sample_weight: optional `[B]` weights (Keras's `sum_over_batch_size`).
        regularization: the L2 term (a scalar), or `None` for none.

    Returns:
        float32 scalars `click`, `aux` (0 without an auxiliary head),
        `regularization` and their sum `total`.

    Examples:
        >>> terms = ClickTask()(np.array([1.0, 0.0]), {"probability": np.array([0.5, 0.5])})
        >>> round(float(terms["total"]), 4)
        0.6931

    References:
        the paper's code (github.com/thuml/DARE); TensorFlow Recommenders, `tfrs.tasks.Ranking`.
    """

    def __call__(self, labels, outputs: dict, sample_weight=None, regularization=None) -> dict:
        click = click_cross_entropy(labels, outputs["probability"], sample_weight)
        aux_probability = outputs.get("aux_probability")
        aux = (click_cross_entropy(labels, aux_probability, sample_weight)
               if aux_probability is not None else ops.zeros((), "float32"))
        reg = ops.zeros((), "float32") if regularization is None else ops.cast(regularization, "float32")
        return {"click": click, "aux": aux, "regularization": reg, "total": click + aux + reg}
