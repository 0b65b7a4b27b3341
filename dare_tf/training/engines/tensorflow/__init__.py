"""The trainer on Keras's TensorFlow backend (`dare_tf.training.engines`)."""
