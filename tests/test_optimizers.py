import keras
import numpy as np
import tensorflow as tf

from dare_tf.optimizers import LazyAdam


def run(optimizer, table, batches, dense=False):
    """Applies sparse gradients (or, with dense=True, the same gradients densified:
    duplicate rows summed, as Adam's maths defines them)."""
    for ids, grads in batches:
        grad = tf.IndexedSlices(tf.constant(grads, tf.float32), tf.constant(ids),
                                dense_shape=tf.constant(table.shape))
        optimizer.apply([tf.convert_to_tensor(grad) if dense else grad], [table])
    return table.numpy()


def test_lazy_adam_matches_adam_on_touched_rows_and_leaves_others(rng):
    init = rng.normal(size=(10, 3)).astype("float32")
    batches = [(np.array([1, 3, 1]), rng.normal(size=(3, 3))), (np.array([3, 5]), rng.normal(size=(2, 3)))]
    lazy = run(LazyAdam(0.1), keras.Variable(init), batches)
    dense = run(keras.optimizers.Adam(0.1), keras.Variable(init), batches, dense=True)
    untouched = [0, 2, 4, 6, 7, 8, 9]
    np.testing.assert_array_equal(lazy[untouched], init[untouched])
    # Row 1 was touched in step 1 only: dense Adam keeps moving it in step 2.
    assert np.abs(dense[1] - lazy[1]).max() > 1e-4
    # Rows touched every step (row 3) and first-step values agree with Adam.
    np.testing.assert_allclose(lazy[3], dense[3], rtol=1e-5, atol=1e-6)
    one_step_lazy = run(LazyAdam(0.1), keras.Variable(init), batches[:1])
    one_step_dense = run(keras.optimizers.Adam(0.1), keras.Variable(init), batches[:1], dense=True)
    np.testing.assert_allclose(one_step_lazy, one_step_dense, rtol=1e-5, atol=1e-6)


def test_lazy_adam_dense_gradients_are_adam(rng):  # via FusedAdam's kernel
    init = rng.normal(size=(4, 2)).astype("float32")
    g = [tf.constant(rng.normal(size=(4, 2)), tf.float32) for _ in range(3)]
    a, b = keras.Variable(init), keras.Variable(init)
    la, da = LazyAdam(0.05), keras.optimizers.Adam(0.05)
    for grad in g:
        la.apply([grad], [a])
        da.apply([grad], [b])
    # The fused kernel orders the float operations differently: ~1e-6 apart.
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_fused_adam_equals_keras_adam(rng):
    from dare_tf.optimizers import FusedAdam

    init = rng.normal(size=(50, 4)).astype("float32")
    a, b = keras.Variable(init), keras.Variable(init)
    fused, reference = FusedAdam(0.01), keras.optimizers.Adam(0.01)
    step_a = tf.function(lambda g: fused.apply([g], [a]))
    step_b = tf.function(lambda g: reference.apply([g], [b]))
    for _ in range(5):
        grad = tf.constant(rng.normal(size=(50, 4)) * 1e-3, tf.float32)
        step_a(grad)
        step_b(grad)
    assert np.abs(a.numpy() - init).max() > 1e-3  # it moved
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
