"""dare_tf.model.execution: the two private Keras attributes the package reads are where it
expects them, and the whole-gradient XLA step applies only where it may."""

import keras
import numpy as np
import pytest

from dare_tf import build_model
from dare_tf.model import execution
from tests.conftest import random_batch


def test_keras_compile_loss_is_where_the_model_expects_it():
    """`compile(loss=...)` is refused (the model computes its own loss): it reads
    Keras's `Trainer._compile_loss`, through `compiled_loss` only."""
    from dare_tf.model.training import compiled_loss

    model = build_model("dare", 60, 7, max_len=12, top_k=4, seed=0)
    model.compile(optimizer="adam")
    assert compiled_loss(model) is None
    model.compile(optimizer="adam", loss="binary_crossentropy")
    assert compiled_loss(model) is not None, "Keras renamed Trainer._compile_loss"
    with pytest.raises(ValueError, match="DareModel computes its own loss"):
        model.compute_loss(model.dummy_inputs(2), np.ones(2, "float32"), model(model.dummy_inputs(2)))


def test_keras_loss_tracker_is_where_the_xla_step_expects_it(rng):
    model = build_model("dare", 60, 7, max_len=12, top_k=4, seed=0, sparse_embedding_gradients=False)
    assert execution.loss_tracker(model) is None  # before compile
    model.compile(optimizer="adam")
    tracker = execution.loss_tracker(model)
    assert isinstance(tracker, keras.metrics.Metric), "Keras renamed Trainer._loss_tracker"
    assert execution.whole_gradient_in_xla(model)
    x = random_batch(rng, 32, 12, 60, 7)
    logs = model.train_on_batch(x, rng.integers(0, 2, 32).astype("float32"), return_dict=True)
    assert logs["loss"] == pytest.approx(float(tracker.result()), rel=1e-6)
    sparse = build_model("dare", 60, 7, max_len=12, top_k=4, seed=0)
    sparse.compile(optimizer="adam")
    assert not execution.whole_gradient_in_xla(sparse)  # row-wise gradients: Keras's own step
    assert np.isfinite(logs["loss"])


def test_the_compiled_stages_take_batches_of_any_size_without_tensorflows_retracing_warning():
    """The analyses run a model's forward pass over batches of many sizes (a split's last
    partial batch, the k-means sample, each analysis' subset): TensorFlow warned of
    retracing after five (`make demo`'s part 5). The compiled stages relax the batch size
    after a retrace and give the same probabilities as the uncompiled pass. Nor do many
    models in one process (the analyses of several runs, their gradient runs): TensorFlow
    counts traces by a function's code, which every model's stages shared (before: this
    test failed where the same pytest worker had built 5 models before it, "6 out of the
    last 6 calls to <function DareModel.forward.<locals>.stages> triggered tf.function
    retracing")."""
    import logging

    import tensorflow as tf

    from dare_tf.analysis.runs import forward

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        for seed in range(6):  # (six models in this process, each traced once)
            other = build_model("dare", num_items=40, num_categories=5, max_len=8, top_k=3, jit_compile_dense=True,
                                seed=seed)
            forward(other, random_batch(np.random.default_rng(seed), 4, 8, 40, 5), ["probability"])
        model = build_model("dare", num_items=40, num_categories=5, max_len=8, top_k=3, jit_compile_dense=True)
        for size in (7, 5, 3, 11, 2, 9, 4):
            x = random_batch(np.random.default_rng(size), size, 8, 40, 5)
            compiled = forward(model, x, ["probability"])["probability"]
            plain = keras.ops.convert_to_numpy(model.forward(x, compiled=False)["probability"])
            np.testing.assert_allclose(compiled, plain, atol=1e-6)
    finally:
        tf.get_logger().removeHandler(handler)
    assert [m for m in said if "retracing" in m] == []
