"""dare_tf.training.engines.jax.loop: `trainers.train` on Keras's JAX backend end to end,
in processes where TensorFlow cannot be imported: the run directory a
TensorFlow run writes, a second run of the same seed killed with -9 and resumed to
exactly the same result, another backend's run refused, and the trained
model exported by `serving.export` (on TensorFlow) answering what the JAX model
predicts."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO
from tests.training.common import tensorboard_hparams, tensorboard_scalars

pytest.importorskip("jax")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("jax_trainer")]

# Two epochs of the generated sample at batch 128 (76 steps), a validation and a checkpoint every 10.
FLAGS = ["--model=dare", "--batch_size=128", "--epochs=2", "--eval_every=10", "--seeds=0", "--verbose=0",
         "--bn_statistics_batches=4", "--eval_batch_size=1024", "--max_len=50"]
ENV = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
# After the run, in the same process: the trained model's probabilities on 32 validation examples.
PREDICT = """
import sys, numpy as np, keras
import dare_tf.model.dare_model  # (registers DareModel)
from dare_tf.data.feeding.memory import InMemorySplit
out, data_dir = sys.argv[1], sys.argv[2]
model = keras.saving.load_model(out + "/seed_0/model.keras")
split = InMemorySplit.load(data_dir, "val", max_len=model.model_config.max_len)
x, _ = next(split.host_batches(np.arange(32), 32))
np.savez(out + "/jax_predictions.npz", probability=np.asarray(model.predict(x, verbose=0)), **x)
"""


def train_on_jax(data_dir, out, *flags, wait=True, then=None):
    """`trainers.train` on JAX where TensorFlow cannot be imported; `then`: a script run
    in the same process afterwards (argv: OUT, DATA_DIR)."""
    args = [sys.executable, "tests/no_tensorflow.py", "trainers.train", f"--data_dir={data_dir}",
            f"--output_dir={out}", *FLAGS, *flags]
    if then is not None:
        args = [sys.executable, "-c", RUN_THEN, then, data_dir, out, *args[3:]]
    if not wait:
        return subprocess.Popen(args, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)


# `tests/no_tensorflow.py`'s guard, the trainer (absl's exit caught), then a script.
RUN_THEN = """
import runpy, sys
sys.path.insert(0, "tests")
from no_tensorflow import _NoTensorFlow
sys.meta_path.insert(0, _NoTensorFlow())
then, data_dir, out = sys.argv[1:4]
sys.argv = ["trainers.train", *sys.argv[4:]]
try:
    runpy.run_module("trainers.train", run_name="__main__", alter_sys=True)
except SystemExit as e:
    assert not e.code, e.code
sys.argv = ["then", out, data_dir]
exec(then)
print("tensorflow loaded:", "tensorflow" in sys.modules)
"""


def per_seed(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)["per_seed"][0]


@pytest.fixture(scope="module")
def jax_run(taobao, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("jax_run") / "dare")
    done = train_on_jax(taobao, out, f"--compilation_cache={out}_cache", "--verbose=2", then=PREDICT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "tensorflow loaded: False", done.stdout[-2000:]
    # Issue 69 (8): the run names its devices (and a mesh, with several) as it starts, at --verbose=2 too.
    assert (f"dare on {os.path.basename(taobao)} (JAX, one device, cpu), seed 1 of 1 (seed 0)"
            in done.stdout.splitlines()), done.stdout[-3000:]
    return out


@pytest.fixture(scope="module")
def streamed_run(taobao, tmp_path_factory):
    """Issue 66 (2): the same run with every split streamed from its shards (--in_memory_mb=0)."""
    out = str(tmp_path_factory.mktemp("jax_streamed") / "dare")
    done = train_on_jax(taobao, out, "--in_memory_mb=0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_a_split_past_in_memory_mb_streams_on_jax(jax_run, streamed_run):
    """Every epoch's full batches streamed: the steps, validations and checkpoints of the run
    holding the splits in memory (76 steps of 128 over 2 epochs of 4,9xx examples), the
    validation and test over every example (AUCs of the same examples: their counts equal)."""
    held, streamed = per_seed(jax_run), per_seed(streamed_run)
    history = [json.loads(line) for line in open(f"{streamed_run}/seed_0/history.jsonl")]
    assert [h["step"] for h in history] == [10, 20, 30, 40, 50, 60, 70, 76] and streamed["steps"] == held["steps"]
    assert [h["timing"]["val_examples"] for h in history] == [history[0]["timing"]["val_examples"]] * 8
    assert streamed["test_by_history_length"].keys() == held["test_by_history_length"].keys()
    for group, metrics in held["test_by_history_length"].items():
        assert streamed["test_by_history_length"][group]["count"] == metrics["count"], group
    assert 0.5 < streamed["test"]["auc"] < 1
    assert sorted(os.path.basename(p) for p in glob.glob(f"{streamed_run}/seed_0/checkpoints/*.npz")) == [
        "ckpt-70.npz", "ckpt-76.npz"]


def test_the_trainer_on_jax_writes_a_tensorflow_runs_directory_without_tensorflow(jax_run):
    """Issue 60 (1): the run directory, results, history, best weights and checkpoints, with no TensorFlow."""
    seed = os.path.join(jax_run, "seed_0")
    for name in ("results.json", "run_config.json", "flags.txt", "curves.png", "seed_0/history.jsonl",
                 "seed_0/result.json", "seed_0/model.keras", "seed_0/best.weights.h5"):
        assert os.path.exists(os.path.join(jax_run, name)), name
    assert sorted(os.path.basename(p) for p in glob.glob(f"{seed}/checkpoints/*.npz")) == ["ckpt-70.npz",
                                                                                         "ckpt-76.npz"]
    history = [json.loads(line) for line in open(f"{seed}/history.jsonl")]
    assert [h["step"] for h in history] == [10, 20, 30, 40, 50, 60, 70, 76]
    # Issue 69 (8): flags.txt holds the flags this engine read, not TensorFlow's --cpu_devices/--jit_compile.
    flags_txt = open(os.path.join(jax_run, "flags.txt")).read().splitlines()
    assert f"--compilation_cache={jax_run}_cache" in flags_txt, flags_txt
    assert not [line for line in flags_txt if "cpu_devices" in line or "jit_compile" in line], flags_txt
    result = per_seed(jax_run)
    assert result["steps"] == 76 and result["best_step"] in [h["step"] for h in history if h["best"]]
    assert result["val"] == next(h["val"] for h in history if h["step"] == result["best_step"])
    assert 0.5 < result["test"]["auc"] < 1  # (the TensorFlow trainer: 0.60 with these flags)
    with open(os.path.join(jax_run, "run_config.json")) as f:
        assert json.load(f)["backend"] == "jax"
    # The compiled steps kept in JAX's persistent cache (--compilation_cache) for the next run.
    assert any(name.startswith("jit_steps-") for name in os.listdir(jax_run + "_cache"))
    # TensorBoard, without TensorFlow (issue 66, 2): the TensorFlow run's scalars at the same steps,
    # the training loss at step 50 (--log_every) the mean since the last validation, as fit's logs.
    board = os.path.join(seed, "tensorboard")
    (step, loss), = tensorboard_scalars(os.path.join(board, "train"))["loss"]
    assert step == 50 and loss == pytest.approx(next(h["train_loss"] for h in history if h["step"] == 50), rel=1e-6)
    validation = tensorboard_scalars(os.path.join(board, "validation"))
    assert sorted(validation) == ["auc", "category_auc", "gauc", "logloss"]
    assert validation["auc"] == [(h["step"], pytest.approx(h["val"]["auc"])) for h in history]
    assert tensorboard_scalars(os.path.join(board, "test"))["auc"] == [(result["best_step"],
                                                                        pytest.approx(result["test"]["auc"]))]
    assert tensorboard_hparams(board)["model.coupling"].string_value == "decoupled"


def checkpoints(out):
    return sorted(glob.glob(f"{out}/seed_0/checkpoints/ckpt-*.npz"), key=lambda p: int(p.split("-")[-1][:-4]))


@pytest.mark.parametrize("held", ["in_memory", "streamed"])
def test_the_same_seed_killed_with_minus_9_and_resumed_gives_the_same_result(held, request, taobao, tmp_path):
    """Issue 60 (1, 3), issue 66 (2, 3): a second run of the same seed, killed after its second
    checkpoint, its newest checkpoint then cut short (`head -c 2000`) and a killed writer's
    temporary file beside it, started again: it names the damaged file, resumes from the older
    one, removes the temporary file and ends with the uninterrupted run's result, exactly (on CPU);
    with the splits in memory and streamed from their shards (resumed mid-epoch)."""
    reference = request.getfixturevalue("jax_run" if held == "in_memory" else "streamed_run")
    flags = [] if held == "in_memory" else ["--in_memory_mb=0"]
    out = str(tmp_path / "killed")
    process = train_on_jax(taobao, out, *flags, wait=False)
    deadline = time.time() + 300
    while len([p for p in checkpoints(out) if ".tmp-" not in p]) < 2 and process.poll() is None:
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not os.path.exists(f"{out}/results.json"), "the run finished before it was killed"
    *_, older, newest = [p for p in checkpoints(out) if ".tmp-" not in p]
    with open(newest, "rb") as f:
        head = f.read(2000)
    with open(newest, "wb") as f:
        f.write(head)
    leftover = newest + ".tmp-17210.npz"
    with open(leftover, "wb") as f:
        f.write(head)
    done = train_on_jax(taobao, out, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"warning: {newest}: not a readable checkpoint (not an .npz archive: 2000 bytes); resuming "
            f"from the older {os.path.basename(older)}") in done.stdout.splitlines(), done.stdout[-2000:]
    assert not os.path.exists(leftover)
    history = [json.loads(line)["step"] for line in open(f"{out}/seed_0/history.jsonl")]
    assert history == [10, 20, 30, 40, 50, 60, 70, 76]  # no line twice
    assert per_seed(out)["test"] == per_seed(reference)["test"]


def test_a_tensorflow_run_is_not_resumed_on_jax(taobao, tmp_path):
    """A run directory records its backend: the JAX trainer refuses a TensorFlow run's (and the
    TensorFlow trainer a JAX run's, the same check), naming the field and both values (a run
    recorded before the field is TensorFlow's: issue 66, 3), before any training."""
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.run_directory import RunConfigMismatchError, RunDirectory
    from dare_tf.training import TrainConfig, effective_model_config, run_identity
    from dare_tf.training.seeds import run_seeds

    spec = DatasetSpec.load(taobao)
    config = TrainConfig.create(preset="dare", seeds=(0,), verbose=0)
    model_config = effective_model_config(config, spec, None)
    never = lambda seed, run_dir: pytest.fail("trained")  # noqa: E731
    identity = run_identity(config, model_config, spec)
    for name, recorded in (("tf", {**identity, "backend": "tensorflow"}), ("older", identity)):
        out = str(tmp_path / name)
        RunDirectory(out).start("ranking", recorded, None)
        with pytest.raises(RunConfigMismatchError) as e:
            run_seeds(taobao, out, config, spec, model_config, True, False, None, None, never, backend="jax")
        assert str(e.value) == (f"{out} holds a run with another configuration: backend: 'tensorflow' in the run, "
                                "'jax' now. Use another output directory, or --overwrite to discard that run")


def served_probabilities(export_dir, data_dir, x):
    """The SavedModel under `export_dir` (its one version) on the raw ids of the dense inputs `x`."""
    import tensorflow as tf

    from dare_tf.data.storage.id_maps import read_id_map
    from dare_tf.serving.encoding import pad_histories

    items = np.array([0] + [int(r) for r in read_id_map(data_dir, "item")])
    cats = np.array([0] + [int(r) for r in read_id_map(data_dir, "category")])
    hist_items = [list(items[row[row > 0]]) for row in x["hist_items"]]
    hist_cats = [list(cats[row[row > 0]]) for row in x["hist_categories"]]
    loaded = tf.saved_model.load(glob.glob(os.path.join(export_dir, "*"))[0])
    got = loaded.signatures["serving_default"](
        target_item=tf.constant(items[x["target_item"]], tf.int64),
        target_category=tf.constant(cats[x["target_category"]], tf.int64),
        hist_items=tf.constant(pad_histories(hist_items)), hist_categories=tf.constant(pad_histories(hist_cats)))
    return got["probability"].numpy()


@pytest.mark.xdist_group("jax_trainer")
def test_a_run_trained_on_jax_exports_and_answers_what_the_jax_model_predicts(jax_run, taobao, tmp_path):
    """Issue 60 (3): `serving.export`'s export (TensorFlow) of the JAX run; its SavedModel on raw
    ids equals the JAX model's probabilities (computed in the run's process) within 1e-5."""
    from dare_tf.export import export_run

    jax_out = np.load(os.path.join(jax_run, "jax_predictions.npz"))
    export_run(jax_run, str(tmp_path / "exports"), "dare")  # (what `python -m serving.export --run_dir` runs)
    assert jax_out["probability"].std() > 1e-3
    np.testing.assert_allclose(served_probabilities(str(tmp_path / "exports" / "dare"), taobao, jax_out),
                               jax_out["probability"].reshape(-1), atol=1e-5)


def test_the_grid_program_runs_on_jax_without_tensorflow(taobao, tmp_path):
    """Issue 66 (2): `trainers.reproduce` on JAX (it built a TensorFlow strategy before), where
    TensorFlow cannot be imported: the table of its two models."""
    out = tmp_path / "grid"
    done = subprocess.run([sys.executable, "tests/no_tensorflow.py", "trainers.reproduce", f"--data_dirs={taobao}",
                           "--models=dare,twin", "--dims=8", f"--output_dir={out}", "--epochs=1", "--max_steps=10",
                           "--eval_every=5", "--batch_size=128", "--max_len=50", "--verbose=0"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (out / "table1.md").read_text()
    assert "| dare | " in table and "| twin | " in table, table
    for model in ("dare", "twin"):
        with open(out / "taobao_sample" / "d8" / model / "run_config.json") as f:
            assert json.load(f)["backend"] == "jax"
