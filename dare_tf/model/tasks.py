"""ClickTask: the training objective of the DARE family, as a task object.

In the shape of TensorFlow Recommenders' `tasks.Ranking`: the loss lives in
one object that the model's `compute_loss` calls, so `fit`, `evaluate`, the
distributed loop and the analyses compute the same objective.
"""

from __future__ import annotations

from keras import ops

from dare_tf._faces import public

# reference.md adds 1e-8 to the softmax output before the log.
LOG_EPSILON = 1e-8
# The softmax loss's probabilities are clipped to [e, 1 - e], a float32 interval, before their log-odds.
LOG_ODDS_EPSILON = 1e-6


@public("dare_tf")
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


def group_softmax_cross_entropy(labels, probability, group: int, sample_weight=None):
    """The sampled-softmax loss of clicks among their drawn negatives: examples
    come in consecutive groups of `group` (one click, its negatives), each
    example's logit is its log-odds `log p - log(1 - p)` (the two-way softmax's
    logit difference; p clipped to `[1e-6, 1 - 1e-6]`, so a saturated probability
    gives a finite logit), and each group's loss is the cross entropy of the softmax
    over its logits against its labels (normalised to sum to 1), averaged over
    the groups (`sample_weight`: per example, a group's is its click's)."""
    labels = ops.reshape(ops.cast(labels, "float32"), (-1, group))
    # (1 - 1e-8 rounds to 1 in float32: the log-odds are bounded by +-log((1 - e) / e), e = 1e-6)
    p = ops.clip(ops.reshape(ops.cast(probability, "float32"), (-1, group)), LOG_ODDS_EPSILON, 1.0 - LOG_ODDS_EPSILON)
    logits = ops.log(p) - ops.log(1.0 - p)
    target = labels / ops.maximum(ops.sum(labels, axis=1, keepdims=True), LOG_EPSILON)
    losses = -ops.sum(target * ops.log_softmax(logits, axis=1), axis=1)
    if sample_weight is not None:
        weights = ops.reshape(ops.cast(sample_weight, "float32"), (-1, group))
        losses = losses * ops.sum(weights * target, axis=1)
    return ops.mean(losses)


@public("dare_tf")
class ClickTask:
    """Click cross entropy, plus the auxiliary head's, plus the L2 penalty.

    Args:
        group: None, the pointwise click cross entropy of every example (the
            paper's); an integer, the sampled-softmax loss of each click among
            its drawn negatives (`group_softmax_cross_entropy`: the batch holds
            consecutive groups of `group` examples), for the click's head and
            the auxiliary one.

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

    def __init__(self, group: int | None = None):
        if group is not None and group < 2:
            raise ValueError(f"group={group}: a softmax over a click and its negatives needs >= 2 examples")
        self.group = group

    def _loss(self, labels, probability, sample_weight):
        if self.group is None:
            return click_cross_entropy(labels, probability, sample_weight)
        return group_softmax_cross_entropy(labels, probability, self.group, sample_weight)

    def __call__(self, labels, outputs: dict, sample_weight=None, regularization=None) -> dict:
        click = self._loss(labels, outputs["probability"], sample_weight)
        aux_probability = outputs.get("aux_probability")
        aux = (self._loss(labels, aux_probability, sample_weight)
               if aux_probability is not None else ops.zeros((), "float32"))
        reg = ops.zeros((), "float32") if regularization is None else ops.cast(regularization, "float32")
        return {"click": click, "aux": aux, "regularization": reg, "total": click + aux + reg}
