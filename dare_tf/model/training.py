"""`DareModel`'s training side, as Keras calls it: the loss terms, the train step
(one XLA function where it can be) and Keras's `compute_loss` / `compute_metrics`."""

from __future__ import annotations

import keras
from keras import ops


def _tensorflow_execution():
    """`dare_tf.model.execution` on the TensorFlow backend, else `None`."""
    if keras.backend.backend() != "tensorflow":
        return None
    from dare_tf.model import execution

    return execution


def compiled_loss(model):
    """The loss `compile(loss=...)` gave (`Trainer._compile_loss`), one of the two
    private Keras attributes this package reads (here only; the other:
    `dare_tf.model.execution.loss_tracker`); `None` without one. Backend-neutral.
    tests/model/test_execution.py fails when Keras renames it."""
    return getattr(model, "_compile_loss", None)


class TrainingMixin:
    """The loss and training-step methods of `dare_tf.model.dare_model.DareModel` (a
    `keras.Model` with `task`, `head`, `aux_head`, `forward` and `losses`)."""

    def loss_terms(self, labels, outputs, sample_weight=None) -> dict:
        """`click` + `aux` (if any) + `regularization` (L2) = `total`, float32:
        the model's `task` on `outputs` (a `forward` or training `call` result;
        the L2 term is computed where `outputs` lacks it)."""
        reg = outputs.get("regularization")
        return self.task(labels, outputs, sample_weight, self.regularization() if reg is None else reg)

    def train_step(self, *args):
        """Keras's train step; on TensorFlow with `jit_compile_dense=True` and
        `sparse_embedding_gradients=False` (one replica), the same step with the
        forward pass, `compute_loss` and the gradients in one XLA function
        (`dare_tf.model.execution.xla_train_step`)."""
        execution = _tensorflow_execution()
        if execution is None or not execution.whole_gradient_in_xla(self):  # (JAX passes the state first)
            return super().train_step(*args)
        return execution.xla_train_step(self, args[0])

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The training objective of `fit` and the loss of `evaluate`: `loss_terms(...)["total"]`.

        In training `y_pred` is `call`'s dict of the loss's inputs; in
        `evaluate` it is the probability, and a model with an auxiliary head
        runs its forward pass again for that head's output.
        """
        if compiled_loss(self) is not None:
            raise ValueError("DareModel computes its own loss (click + auxiliary cross entropy + L2, "
                             "see DareModel.compute_loss): compile it without `loss=`")
        if isinstance(y_pred, dict):
            outputs = y_pred
        elif self.aux_head is not None:
            outputs = self.forward(x, training=False)
        else:
            outputs = {"probability": y_pred}
        total = self.loss_terms(y, outputs, sample_weight)["total"]
        execution = _tensorflow_execution()
        return execution.replica_share(total) if execution else total

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Keras's metrics of the click probability (`call`'s dict in training)."""
        if isinstance(y_pred, dict):
            y_pred = y_pred["probability"]
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def regularization(self):
        """The L2 term: the sum of the layers' regularization losses (float32)."""
        losses = self.losses
        if not losses:
            return ops.zeros((), "float32")
        return ops.sum(ops.stack([ops.cast(loss, "float32") for loss in losses]))

    def batch_norm_layers(self) -> dict:
        """Head input name (`features`, `aux_features`) -> the BatchNormalization
        layer in front of that prediction head's MLP."""
        heads = {"features": self.head, "aux_features": self.aux_head}
        return {name: head.norm for name, head in heads.items() if head is not None}
