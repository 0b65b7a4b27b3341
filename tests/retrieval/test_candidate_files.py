"""dare_tf.retrieval.candidate_files: the candidates a retrieval run writes for the rankers
of its cascade (issue 66: read on either engine, without TensorFlow)."""

import os
import shutil

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tfrs, pytest.mark.xdist_group("two_stage")]


def test_a_retrieval_run_writes_the_stages_candidates_and_another_count_without_training(taobao, two_stage,
                                                                                        tmp_path):
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.data.storage.store import load_store
    from dare_tf.retrieval import RetrievalConfig, read_candidates, train_retrieval
    from dare_tf.retrieval.training import RetrievalStage

    run = str(tmp_path / "retrieval")
    shutil.copytree(two_stage["retrieval"], run)  # (the fixture's run stays as it is)
    assert sorted(f for f in os.listdir(run) if f.startswith("candidates")) == ["candidates-200.npz"]
    spec = DatasetSpec.load(taobao)
    val = InMemorySplit.load(taobao, "val", spec).columns
    positive = val["label"] > 0.5
    uid, position = val["uid"][positive], val["position"][positive]
    with pytest.raises(FileNotFoundError) as e:
        read_candidates(run, 50, "val", uid, position)
    assert str(e.value) == (f"--retrieval_run={run}: no candidates-50.npz (the run wrote the candidates of 200): run "
                            "python -m trainers.train_retrieval on it again with its flags and --cascade_candidates=50 "
                            "(it writes them without training again)")
    checkpoints = {f: os.path.getmtime(os.path.join(run, "seed_0", "checkpoints", f))
                   for f in os.listdir(os.path.join(run, "seed_0", "checkpoints"))}
    train_retrieval(taobao, run, RetrievalConfig(epochs=2, batch_size=256, cascade_candidates=(50, 200)))
    assert {f: os.path.getmtime(os.path.join(run, "seed_0", "checkpoints", f)) for f in checkpoints} == checkpoints
    windows = dict(zip(("hist_items", "hist_categories"), load_store(taobao, spec).windows(uid, position,
                                                                                           spec.max_len)))
    stage = RetrievalStage.load(taobao, run)
    for n in (50, 200):  # (in the positives' order, a user's positive twice included)
        np.testing.assert_array_equal(read_candidates(run, n, "val", uid[::-1], position[::-1]),
                                      stage.candidates(windows, n)[::-1])
    with pytest.raises(ValueError) as e:
        read_candidates(run, 50, "val", np.array([10**6]), np.array([3]))
    assert str(e.value) == (f"{run}/candidates-50.npz: no candidates of the val positive of user 1000000 at position 3 "
                            "(1 of 1 missing): the file is of another preparation of the dataset; run the retrieval "
                            "again")
    with open(f"{run}/candidates-50.npz", "r+b") as f:
        f.truncate(2000)
    with pytest.raises(ValueError) as e:
        read_candidates(run, 50, "val", uid, position)
    assert str(e.value) == (f"{run}/candidates-50.npz: not a readable candidates file (BadZipFile); run python -m "
                            f"trainers.train_retrieval on {run} again with --cascade_candidates=50")
    with pytest.raises(ValueError) as e:  # (before training)
        train_retrieval(taobao, str(tmp_path / "other"), RetrievalConfig(epochs=1, cascade_candidates=(10**7,)))
    assert str(e.value).startswith("--cascade_candidates=10000000 is larger than the catalogue (")
    assert not os.path.exists(tmp_path / "other" / "seed_0")
