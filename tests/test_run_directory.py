"""RunDirectory: a run directory never mixes configurations, one writer at a time, kinds."""

import json
import os
import subprocess
import sys

import pytest

from dare_tf.training import TrainConfig, train
from tests.conftest import ENV, REPO
from tests.programs import run_program
from tests.training.common import TINY, train_args


@pytest.mark.slow
def test_rerun_with_other_flags_is_refused_naming_the_fields(taobao, tmp_path):
    from dare_tf.training import RunConfigMismatchError

    out = str(tmp_path / "run")
    first = train(taobao, out, TrainConfig.create(preset="dare", **TINY))
    again = train(taobao, out, TrainConfig.create(preset="dare", **TINY))  # identical: reused
    assert again["test"] == first["test"]
    # The runtime section does not identify a run: another one reuses it.
    runtime = dict(verbose=2, log_every=7, steps_per_execution=5)
    assert train(taobao, out, TrainConfig.create(preset="dare", **dict(TINY, **runtime)), report=lambda s: None
                 )["test"] == first["test"]
    # A run recorded before a model field existed (hash_bits) matches that field's default.
    recorded = json.load(open(os.path.join(out, "run_config.json")))
    del recorded["model_config"]["hash_bits"]
    json.dump(recorded, open(os.path.join(out, "run_config.json"), "w"))
    assert train(taobao, out, TrainConfig.create(preset="dare", **TINY))["test"] == first["test"]
    with pytest.raises(RunConfigMismatchError, match="model_config.hash_bits: 32 in the run, 8 now"):
        train(taobao, out, TrainConfig.create(preset="dare", **dict(TINY, model_overrides=dict(
            TINY.get("model_overrides", {}), hash_bits=8))))
    before = open(os.path.join(out, "results.json")).read()
    changed = dict(TINY, learning_rate=0.02, model_overrides=dict(top_k=5, embedding_dim=8))
    with pytest.raises(RunConfigMismatchError) as err:
        train(taobao, out, TrainConfig.create(preset="twin", **changed))
    message = str(err.value)
    for field in ("train_config.preset: 'dare' in the run, 'twin' now",
                  "train_config.optimizer.learning_rate: 0.01 in the run, 0.02 now",
                  "model_config.embedding_dim: 16 in the run, 8 now", "model_config.coupling"):
        assert field in message, message
    assert open(os.path.join(out, "results.json")).read() == before  # untouched
    (tmp_path / "run" / "my_notes.txt").write_text("keep")
    result = train(taobao, out, TrainConfig.create(preset="twin", **changed), overwrite=True)
    assert result["config"]["preset"] == "twin"
    assert json.load(open(os.path.join(out, "run_config.json")))["model_config"]["embedding_dim"] == 8
    assert (tmp_path / "run" / "my_notes.txt").read_text() == "keep"


def test_another_dataset_in_the_same_run_dir_is_refused(taobao, planted, tmp_path):
    from dare_tf.training import RunConfigMismatchError

    out = str(tmp_path / "run")
    train(taobao, out, TrainConfig.create(preset="dare", **TINY))
    with pytest.raises(RunConfigMismatchError, match="dataset.fingerprint"):
        train(planted[0], out, TrainConfig.create(preset="dare", **TINY))


def test_one_trainer_per_run_directory_and_a_killed_holders_lock_is_taken_over(taobao, tmp_path):
    """A second trainer on a run directory in use stops at once with one line naming
    the holder's pid (exit 1) and writes nothing; the lock of a killed holder is
    taken over."""
    from dare_tf.run_directory import LOCK, RunDirectory, RunLockedError

    out = tmp_path / "run"
    with RunDirectory(str(out)).lock():
        result = run_program("trainers.train", *train_args(taobao, out))
        assert result.returncode == 1, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"error: {out} is in use by another trainer (pid {os.getpid()}); wait for it to finish or choose "
            "another --output_dir")
        assert os.listdir(out) == [LOCK]
        with pytest.raises(RunLockedError):  # also within one process
            with RunDirectory(str(out)).lock():
                pass
    # (the context manager is kept: collected, it would release the lock before the kill)
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from dare_tf.run_directory import RunDirectory; "
                             "held = RunDirectory(sys.argv[1]).lock(); held.__enter__(); os.kill(os.getpid(), 9)",
                             str(out)],
                            cwd=REPO, env=ENV, capture_output=True, text=True)
    assert killed.returncode == -9
    assert (out / LOCK).read_text().strip() != str(os.getpid())  # the killed process's pid
    with RunDirectory(str(out)).lock():
        assert (out / LOCK).read_text().strip() == str(os.getpid())
    # Issue 59 (11): another program's flock, which records nothing, is `pid unknown`, as data.prepare says.
    import fcntl

    with open(out / LOCK, "w") as foreign:
        fcntl.flock(foreign, fcntl.LOCK_EX)
        with pytest.raises(RunLockedError, match=f"^{out} is in use by another trainer \\(pid unknown\\); wait"):
            with RunDirectory(str(out)).lock():
                pass


def test_kind_is_recorded_and_inferred_for_older_runs_and_required(tmp_path):
    from dare_tf.run_directory import RunConfigMismatchError, RunDirectory

    identity = {"retrieval_config": {"epochs": 2}, "dataset": {"fingerprint": "f"}}
    run = RunDirectory(str(tmp_path / "r"))
    run.start("retrieval", identity)
    assert run.kind == "retrieval" and run.identity() == {"kind": "retrieval", **identity}
    legacy = tmp_path / "old"
    legacy.mkdir()
    (legacy / "run_config.json").write_text(json.dumps({"train_config": {}, "dataset": {"fingerprint": "f"}}))
    assert RunDirectory(str(legacy)).kind == "ranking"
    with pytest.raises(FileNotFoundError, match="results.json not found; is it a finished run of python -m "
                                                "trainers.train_retrieval"):
        run.require("retrieval")
    (tmp_path / "r" / "results.json").write_text("{}")
    assert run.require("retrieval", "f")["retrieval_config"] == {"epochs": 2}
    with pytest.raises(ValueError, match="is a retrieval run, not a ranking run$"):
        run.require("ranking")
    with pytest.raises(ValueError, match=r"trained on another dataset \(fingerprint f, not g\)$"):
        run.require("retrieval", "g")
    run.check("retrieval", identity)  # the same run: nothing to say
    with pytest.raises(RunConfigMismatchError, match="kind: 'retrieval' in the run, 'ranking' now"):
        run.check("ranking", identity)
    with pytest.raises(ValueError, match="^RunDirectory.start: kind='x' is not one of"):
        run.start("x", {})


def _strict(text: str):
    """A parser that refuses what standard JSON does not have (NaN, Infinity)."""
    def refuse(constant):
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_results_and_history_are_standard_json_with_undefined_metrics_as_null(tmp_path):
    import math

    import numpy as np

    from dare_tf._files import atomic_json
    from dare_tf.run_directory import HISTORY, read_history
    from dare_tf.training.callbacks import truncate_history

    results = {"test": {"auc": np.float32(0.75), "gauc": float("nan"), "logloss": np.float64(np.inf)},
               "per_seed": [{"val": {"auc": np.float64(0.5)}, "steps": np.int64(4)}]}
    atomic_json(str(tmp_path / "results.json"), results)
    parsed = _strict((tmp_path / "results.json").read_text())
    assert parsed == {"test": {"auc": 0.75, "gauc": None, "logloss": None},
                      "per_seed": [{"val": {"auc": 0.5}, "steps": 4}]}
    # history lines: written standard, read back with NaN for the undefined metric
    with open(tmp_path / HISTORY, "w") as f:
        f.write('{"step": 1, "train_loss": null, "val": {"auc": 0.6, "gauc": null}}\n')
        f.write('{"step": 2, "train_loss": 0.5, "val": {"auc": 0.7, "gauc": 0.1}}\n')
    history = read_history(str(tmp_path))
    assert math.isnan(history[0]["val"]["gauc"]) and math.isnan(history[0]["train_loss"])
    truncate_history(str(tmp_path), 1)
    assert [_strict(line) for line in (tmp_path / HISTORY).read_text().splitlines()] == [
        {"step": 1, "train_loss": None, "val": {"auc": 0.6, "gauc": None}}]


def test_a_run_that_fails_before_writing_leaves_no_directory(tmp_path):
    from dare_tf.run_directory import RunDirectory

    run = RunDirectory(str(tmp_path / "new"))
    with pytest.raises(RuntimeError, match="^failed$"):
        with run.lock():
            assert os.listdir(tmp_path / "new") == [".lock"]
            raise RuntimeError("failed")
    assert not (tmp_path / "new").exists()  # created by the run, empty: removed with its lock
    (tmp_path / "theirs").mkdir()
    with pytest.raises(RuntimeError):
        with RunDirectory(str(tmp_path / "theirs")).lock():
            raise RuntimeError("failed")
    assert os.listdir(tmp_path / "theirs") == []  # a directory it did not create stays, as it was
    with RunDirectory(str(tmp_path / "kept")).lock():
        (tmp_path / "kept" / "results.json").write_text("{}")
    assert sorted(os.listdir(tmp_path / "kept")) == [".lock", "results.json"]


def test_a_new_run_into_a_directory_of_someone_elses_files_is_refused_and_left_as_it_was(taobao, tmp_path):
    """Issue 68 (12): `trainers.train --output_dir=DIR` trained into a directory holding a user's
    README.md and docs/ (rc 0), where the other programs refuse such a directory; and its refusal of
    a run without run_config.json listed the `.lock` it had just created."""
    from tests.programs import run_program
    from tests.training.common import train_args

    mine = tmp_path / "mine"
    (mine / "docs").mkdir(parents=True)
    (mine / "README.md").write_text("my notes")
    done = run_program("trainers.train", *train_args(taobao, mine))
    assert (done.returncode, done.stderr.strip().splitlines()) == (1, [
        f"error: --output_dir={mine} holds files the trainer did not write: 'README.md', 'docs'. Refusing to change "
        "it: move them away or choose another directory"]), done.stderr[-2000:]
    assert sorted(os.listdir(mine)) == ["README.md", "docs"]  # no .lock left behind
    older = tmp_path / "older"
    (older / "seed_0").mkdir(parents=True)
    (older / "results.json").write_text("{}")
    done = run_program("trainers.train", *train_args(taobao, older))
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        f"error: {older} holds a run without run_config.json (written by an older version): 'results.json', "
        "'seed_0'; its configuration cannot be checked. Use another output directory, or --overwrite to discard "
        "that run"), done.stderr[-2000:]
    assert sorted(os.listdir(older)) == [".lock", "results.json", "seed_0"]  # (a run's directory: its lock stays)
