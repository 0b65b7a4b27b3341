"""LazyAdam: Adam that updates only the embedding rows seen in the batch."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


def _read_rows(variable, rows):
    """Gathers rows straight from the resource variable. Converting the whole
    variable to a tensor first (as `ops.take` does) copies every row when the
    same step later scatters into it."""
    return tf.gather(getattr(variable, "value", variable), rows)


@keras.saving.register_keras_serializable(package="dare_tf")
class LazyAdam(keras.optimizers.Adam):
    """Adam whose sparse (embedding) updates touch only the rows in the batch.

    For a dense gradient it is Adam. For a `tf.IndexedSlices` gradient (what
    an embedding lookup produces) the moments and the weights of the looked-up
    rows are updated with Adam's formula and every other row is left alone,
    so a step costs the same whatever the vocabulary size. Rows that are not
    looked up keep their moments instead of decaying them, which is where it
    differs from dense Adam (reference mode uses dense Adam).

    Args: as `keras.optimizers.Adam` (amsgrad is not supported).

    References:
        Kingma and Ba, "Adam: A Method for Stochastic Optimization", 2015;
        the "lazy" sparse variant of TensorFlow Addons' LazyAdam.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.amsgrad:
            raise ValueError("LazyAdam does not support amsgrad")

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        rows, position = tf.unique(gradient.indices)
        grad = tf.math.unsorted_segment_sum(tf.cast(gradient.values, dtype), position, tf.shape(rows)[0])
        step = ops.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = ops.cast(self.beta_1, dtype), ops.cast(self.beta_2, dtype)
        alpha = ops.cast(learning_rate, dtype) * ops.sqrt(1 - ops.power(beta_2, step)) / (
            1 - ops.power(beta_1, step))
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        m_rows = beta_1 * _read_rows(m, rows) + (1 - beta_1) * grad
        v_rows = beta_2 * _read_rows(v, rows) + (1 - beta_2) * ops.square(grad)
        self.assign(m, tf.IndexedSlices(m_rows, rows))
        self.assign(v, tf.IndexedSlices(v_rows, rows))
        self.assign_sub(variable, tf.IndexedSlices(alpha * m_rows / (ops.sqrt(v_rows) + self.epsilon), rows))
