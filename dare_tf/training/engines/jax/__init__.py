"""The trainer on Keras's JAX backend, with no TensorFlow (`dare_tf.training.engines`)."""
