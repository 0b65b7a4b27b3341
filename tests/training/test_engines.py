"""dare_tf.training.engines (and its `choice`): the engine of each backend, the one place that asks
which backend Keras runs on (the grep: tests/test_package.py)."""

import re

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

    assert [engine_train(name).__name__ for name in engines.DOC_TAGS] == ["train_on_tensorflow", "train_on_jax"]
    assert unread_by("jax") == ("cpu_devices", "jit_compile")
    assert unread_by("tensorflow") == ("compilation_cache",)


@pytest.mark.slow
def test_the_trainer_tests_marked_engines_pass_on_jax_too():
    """Issue 66 (2): the trainer's tests marked `engines` (tests/training/test_loop.py: the
    models learn the planted log, a fixed seed reproduces its run, the paper's schedule warns
    before it trains, steps_per_execution trains the same run; test_callbacks.py: a
    non-finite loss stops the run naming its step; test_evaluation.py: the results by
    history length and the undertraining warnings; test_continuation.py: a model
    grown from an earlier run (`--init_from`) scores old ids as it did, a short continuation
    reaches a full retrain's AUC and records its start, and what cannot be continued is
    refused in one line), which pass here on TensorFlow's
    engine, pass on JAX's, in a process where TensorFlow cannot load."""
    from tests.no_tensorflow import pytest_on_jax

    # (XLA optimising: the continuation module trains ~470 steps at batch 512, measured 81 -> 54 CPU s
    # for it, 134 -> 116 for this run, against the unoptimised code the other JAX processes keep)
    done = pytest_on_jax("-m", "engines", "tests/training/test_loop.py", "tests/training/test_callbacks.py",
                         "tests/training/test_evaluation.py", "tests/training/test_continuation.py", optimized=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # (the 11 marked `engines`, every one passed; the modules' other tests are TensorFlow's)
    assert re.match(r"11 passed, \d+ deselected in ", done.stdout.splitlines()[-1]), done.stdout[-2000:]
