"""How `DareModel` runs on TensorFlow: XLA over the dense stages, sparse or dense
table gradients, the whole-gradient XLA train step, replica shares of the loss.

The model module stays backend-neutral (`keras.ops` only); it asks this module
what to run when the backend is TensorFlow. On JAX, `jax.jit` compiles Keras's
whole step and none of this applies.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf


def _replicated(model) -> bool:
    # Synchronised BatchNorm (several replicas) cannot sit in a nested compiled function.
    return model.model_config.synchronized_batch_norm or tf.distribute.get_strategy().num_replicas_in_sync > 1


def compiled_stages(model, stages, training: bool):
    """`ids -> outputs` for `stages(ids, rows=None)`: the dense stages compiled by XLA
    (`jit_compile_dense`), with the table lookups outside the compiled function
    when the tables' gradients must stay sparse (`sparse_embedding_gradients`),
    inside it otherwise. Uncompiled where XLA cannot take it (replicas). A batch of
    another size retraces once, then the trace takes any size (`reduce_retracing`:
    XLA still compiles each size it meets; the analyses' many sizes no longer each
    trace, nor warn)."""
    if not model.jit_compile_dense or _replicated(model):
        return stages
    cache = model._compiled_stages
    if training not in cache:
        # (a partial: TensorFlow counts traces by the function's code, which every model's `stages`
        # shares, and would warn of "retracing" after five models in one process; a partial has none)
        compiled = tf.function(functools.partial(stages), jit_compile=True, autograph=False, reduce_retracing=True)
        if model.sparse_embedding_gradients:
            # Lookups outside the compiled function: the tables' gradients stay sparse.
            cache[training] = lambda ids: compiled(ids, model.lookup(ids))
        else:
            cache[training] = compiled
    return cache[training]


def loss_tracker(model):
    """Keras's loss metric of `train_step` (`Trainer._loss_tracker`), one of the two
    private Keras attributes this package reads (here only; the other:
    `dare_tf.model.training.compiled_loss`); `None` before `compile`.
    tests/model/test_execution.py fails when Keras renames it."""
    return getattr(model, "_loss_tracker", None)


def whole_gradient_in_xla(model) -> bool:
    """Whether `train_step` runs forward, loss and gradients in one XLA function:
    TensorFlow, `jit_compile_dense`, dense table gradients, one replica, and
    Keras's own `compile(jit_compile=...)` off."""
    return (model.jit_compile_dense and not model.sparse_embedding_gradients and not _replicated(model)
            and not model.jit_compile and loss_tracker(model) is not None)


def xla_train_step(model, data):
    """Keras's train step with the forward pass, `compute_loss` and the gradients in
    one XLA function (the optimizer update stays outside it: TensorFlow's fused
    Adam kernel is several times faster than XLA's on CPU). Same loss tracking,
    loss scaling, update and metrics as Keras's default step."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    cache = model._compiled_stages
    if "gradients" not in cache:
        def loss_and_gradients(x, y, sample_weight):
            with tf.GradientTape() as tape:
                outputs = model.forward(x, training=True, compiled=False)
                loss = model.compute_loss(x, y, outputs, sample_weight, training=True)
                scaled = model.optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled, model.trainable_weights)
            return loss, [tf.convert_to_tensor(g) for g in gradients], outputs["probability"]

        cache["gradients"] = tf.function(loss_and_gradients, jit_compile=True, autograph=False)
    loss, gradients, probability = cache["gradients"](x, y, sample_weight)
    loss_tracker(model).update_state(loss, sample_weight=tf.shape(probability)[0])
    model.optimizer.apply_gradients(zip(gradients, model.trainable_weights))
    return model.compute_metrics(x, y, probability, sample_weight=sample_weight)


def replica_share(total):
    """Keras's convention under a distribution strategy: each replica returns its
    share of the loss; the gradients are summed over replicas."""
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False:
        return total / tf.distribute.get_strategy().num_replicas_in_sync
    return total
