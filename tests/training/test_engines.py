"""dare_tf.training.engines (and its `choice`): the engine of each backend, the one place that asks
which backend Keras runs on (the grep: tests/test_package.py)."""

import pytest

from dare_tf.training import engines
from dare_tf.training.engines.choice import engine_train


def test_each_backend_has_its_engine_and_another_is_refused_in_one_line():
    assert engine_train("tensorflow").__qualname__ == "train_on_tensorflow"
    assert engine_train("jax").__module__ == "dare_tf.training.engines.jax.loop"
    assert engine_train().__qualname__ == "train_on_tensorflow"  # (the tests' backend)
    with pytest.raises(ValueError) as e:
        engine_train("torch")
    assert str(e.value) == ("the trainer runs on Keras's TensorFlow or JAX backend; KERAS_BACKEND is 'torch': set it "
                            "to jax or unset it, or train with DareModel's own compile/fit on that backend "
                            "(docs/library.md)")


def test_the_flags_each_engine_leaves_unread_are_the_other_engines():
    from dare_tf.training.program_flags import unread_by

    assert set(engines.DOC_TAGS) == set(engines.ENGINES)
    assert unread_by("jax") == ("cpu_devices", "jit_compile")
    assert unread_by("tensorflow") == ("compilation_cache",)
