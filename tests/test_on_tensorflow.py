"""dare_tf._on_tensorflow: what only Keras's TensorFlow backend does (a SavedModel's
export, the analyses' split gradients), asked of a child process on it by a process
on JAX (issue 66: `KERAS_BACKEND=jax make demo` exports and analyses)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO

JAX_ENV = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")


def test_the_child_runs_on_tensorflow_whatever_the_parents_backend_and_fails_in_one_line(monkeypatch):
    import keras

    from dare_tf._on_tensorflow import on_tensorflow

    # On TensorFlow's backend, called here, with the objects only this process can hand it.
    assert on_tensorflow("builtins", "sorted", [[3, 1, 2]], "sorting", reverse=True) == [3, 2, 1]
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")  # (a process on JAX)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    lines = []  # (one child: its backend printed, its lines forwarded)
    assert on_tensorflow("builtins", "exec", ["import keras; print('a child on', keras.backend.backend())"],
                         "printing", lines.append) is None
    assert lines == ["a child on tensorflow"]
    with pytest.raises(ChildProcessError) as e:  # (an OSError: the programs print it in one line)
        on_tensorflow("dare_tf.no_such_module", "f", [], "the thing")
    assert str(e.value) == ("the thing runs on Keras's TensorFlow backend, in a process of its own, which failed: "
                            "ModuleNotFoundError: No module named 'dare_tf.no_such_module'")


@pytest.mark.slow
def test_a_process_on_jax_exports_a_run_and_its_gradients_analysis_runs(planted, tmp_path):
    """`export_run` and the suite's gradients analysis called in a process on JAX: the
    SavedModel is written (by a child on TensorFlow) and answers what the run's model
    predicts; the gradients analysis returns its numbers and figures."""
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.run_directory import RunDirectory
    from dare_tf.training import TrainConfig, train
    from tests.training.test_jax_loop import served_probabilities

    data_dir, _ = planted
    run = str(tmp_path / "run")
    train(data_dir, run, TrainConfig.create(preset="dare", batch_size=64, epochs=1, max_steps=4, eval_every=2,
                                            verbose=0, model_overrides=dict(top_k=5, embedding_dim=4)))
    code = ("import json, sys; from dare_tf.export import export_run; "
            "from dare_tf.analysis.suite import run_analyses; from dare_tf.analysis.config import AnalysisConfig; "
            "import keras; assert keras.backend.backend() == 'jax'; "
            "path = export_run(sys.argv[1], sys.argv[2], 'dare'); "
            "out = run_analyses(sys.argv[3], {}, sys.argv[4], AnalysisConfig(gradient_steps=4, gradient_samples=2, "
            "batch_size=32, gradient_presets=('twin',)), analyses=('gradients',), report=lambda s: None); "
            "print(json.dumps([path, out['gradients']['model'], sorted(out['figures'])]))")
    done = subprocess.run([sys.executable, "-c", code, run, str(tmp_path / "e"), data_dir, str(tmp_path / "a")],
                          cwd=REPO, env=JAX_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    path, model, figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert path == str(tmp_path / "e" / "dare" / "1") and model == "twin"
    assert figures == ["gradients", "gradients_by_category"] or figures == ["gradients"]
    assert os.path.exists(tmp_path / "a" / "figures" / "gradient_conflict.png")
    split = InMemorySplit.load(data_dir, "val", max_len=RunDirectory(run).load_model().model_config.max_len)
    x, _ = next(split.host_batches(np.arange(16), 16))
    expected = np.asarray(RunDirectory(run).load_model().predict(x, verbose=0)).reshape(-1)
    np.testing.assert_allclose(served_probabilities(f"{tmp_path}/e/dare", data_dir, x), expected, atol=1e-5)
