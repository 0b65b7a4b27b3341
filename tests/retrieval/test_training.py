"""`trainers.train_retrieval` and the retrieval export, as programs (each in a process of its own)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import LOUD_ENV, REPO, noise
from tests.programs import run_program



@pytest.mark.slow
def test_train_retrieval_program_writes_recall_and_the_popularity_baseline(taobao, tmp_path):
    out = tmp_path / "retrieval"
    command = [sys.executable, "-m", "trainers.train_retrieval", f"--data_dir={taobao}", f"--output_dir={out}",
               "--epochs=2", "--batch_size=256"]
    done = subprocess.run(command, cwd=REPO, env=LOUD_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not noise(done.stdout + done.stderr)  # quiet in a user's environment
    # one trainer per run directory: a second one, while another holds it, is refused in one line
    from dare_tf.run_directory import RunDirectory

    with RunDirectory(str(out)).lock():
        locked = run_program(*command[2:])
    assert locked.returncode == 1 and locked.stderr.strip().splitlines() == [
        f"error: {out} is in use by another trainer (pid {os.getpid()}); wait for it to finish or choose another "
        "--output_dir"], locked.stderr[-2000:]
    results = json.load(open(out / "results.json"))
    # the program prints each source's recall and the quotas, its warnings beneath, and writes flags.txt
    printed, _, tail = done.stdout.rpartition("}\n")
    printed = json.loads(printed + "}")
    assert printed["quotas"] == results["quotas"] and printed["test_sources"] == results["test_sources"]
    assert tail.splitlines() == [f"warning: {w}" for w in results["warnings"]]
    assert "--epochs=2" in (out / "flags.txt").read_text().splitlines()
    keys = ["recall@10", "recall@50", "recall@100", "recall@200"]
    parts = {"test": results["test"], "test_popularity": results["test_popularity"], **results["test_sources"]}
    assert sorted(results["test_sources"]) == ["popularity", "recent_categories", "two_tower"]
    for part, recall in parts.items():
        values = [recall[k] for k in keys]
        assert values == sorted(values) and 0 <= values[0] and values[-1] <= 1, (part, values)
    assert sorted(results["quotas"]) == sorted(results["test_sources"]) and sum(results["quotas"].values()) == 1
    assert results["quotas"]["recent_categories"] >= 0.25  # the floor (--recent_floor), issue 65 (2)
    assert results["catalogue"] > 1000 and results["test_positives"] == 86
    # TensorBoard: the test recall@K of each seed at its last step.
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "seed_0" / "tensorboard" / "test"), size_guidance={"tensors": 0})
    events.Reload()
    assert sorted(events.Tags()["tensors"]) == sorted(keys)
    (event,) = events.Tensors("recall@200")
    assert event.step > 0 and float(tf.make_ndarray(event.tensor_proto)) == pytest.approx(
        results["per_seed"][0]["test"]["recall@200"])
    exported = subprocess.run([sys.executable, "-m", "serving.export", f"--run_dir={out}",
                               f"--export_base={tmp_path / 'exports'}", "--model_name=retrieval", "--top_n=50"],
                              cwd=REPO, env=LOUD_ENV, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert not noise(exported.stdout + exported.stderr)
    assert exported.stdout.strip().endswith(os.path.join("exports", "retrieval", "1"))


@pytest.mark.tfrs
def test_positives_assemble_the_windows_of_the_positive_examples_only(taobao):
    """At 5M training examples every example's window is 8 GB; the positives' are what is used."""
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.retrieval.training import positives

    split = InMemorySplit.load(taobao, "train")
    got = positives(split)
    assert split._features is None  # nothing assembled for every example
    keep = split.labels > 0.5
    assert 0 < keep.sum() < len(split)
    for name in ("hist_items", "hist_categories", "target_item", "target_category"):
        expected = split.features[name][keep]
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape
        np.testing.assert_array_equal(got[name], expected)


@pytest.mark.tfrs
def test_at_most_keeps_a_seeded_sample_of_the_evaluation_positives_in_order():
    from dare_tf.retrieval.config import RetrievalConfig
    from dare_tf.retrieval.training import at_most

    examples = {"target_item": np.arange(100) * 2, "hist_items": np.arange(200).reshape(100, 2)}
    assert at_most(examples, 100) is examples
    sample = at_most(examples, 10)
    assert len(sample["target_item"]) == 10 and (np.diff(sample["target_item"]) > 0).all()
    np.testing.assert_array_equal(sample["hist_items"][:, 0], sample["target_item"])  # the same rows of each column
    np.testing.assert_array_equal(at_most(examples, 10)["target_item"], sample["target_item"])
    with pytest.raises(ValueError, match="^eval_positives=0: must be >= 1$"):
        RetrievalConfig(eval_positives=0)
    with pytest.raises(ValueError, match=r"^recent_floor=0.3: must be 0, 0.25, 0.5, 0.75 or 1 \(the quota grid's "
                                         r"steps\)$"):
        RetrievalConfig(recent_floor=0.3)


@pytest.mark.tfrs
def test_training_batches_are_the_positives_shuffled_with_their_windows_assembled_per_batch(taobao):
    """The towers' batches: what `from_tensor_slices(positives).shuffle(n, seed).batch(b)`
    gave when every history was held in memory, batch for batch."""
    import tensorflow as tf

    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.retrieval.training import positive_columns, positives, training_batches

    split = InMemorySplit.load(taobao, "train")
    columns = positive_columns(split)
    share = np.bincount(columns["target_item"], minlength=int(columns["target_item"].max()) + 1) / len(
        columns["target_item"])
    whole = positives(split)
    whole["sampling_probability"] = share[whole["target_item"]].astype(np.float32)
    count = len(whole["target_item"])
    expected = list(tf.data.Dataset.from_tensor_slices(whole).shuffle(count, seed=4).batch(64).as_numpy_iterator())
    got = list(training_batches(split, columns, share, 64, seed=4).as_numpy_iterator())
    assert len(got) == len(expected) == -(-count // 64) and split._features is None
    for a, b in zip(got, expected):
        assert sorted(a) == sorted(b)
        for name in a:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.tfrs
def test_the_quotas_give_the_recent_categories_source_its_floor(monkeypatch):
    """Issue 65 (2): where the validation recall favours the two-tower alone, `recent_floor`
    (default 0.25) still gives the recent-categories source that share, so the clicks of a new
    category bring its items among the candidates; 0 leaves the choice to the validation."""
    import dare_tf.retrieval.training as training
    from dare_tf.retrieval.candidates import CandidateMerger

    size, num_categories = 1000, 5  # (more items than the largest K, 200)
    item_category = np.where(np.arange(size) == size - 1, 4, np.arange(size) % 3 + 1)
    merger = CandidateMerger(item_category, np.arange(size, 0, -1).astype(float), num_categories, depth=400)
    # every target is the tower's best slot (the last, the least popular), of a category no history holds
    examples = {"hist_items": np.array([[0, 3], [0, 7]]), "hist_categories": np.array([[0, 1], [0, 2]]),
                "target_item": np.array([size, size])}
    monkeypatch.setattr(training, "tower_scores", lambda model, catalogue: lambda items, cats: np.tile(
        np.arange(size, dtype=np.float32), (len(items), 1)))
    chosen = {floor: training.evaluate_candidates(None, merger, None, examples, examples, False, floor)["quotas"]
              for floor in (0.0, 0.25, 0.5)}
    assert chosen[0.0] == {"two_tower": 1.0, "popularity": 0.0, "recent_categories": 0.0}
    assert chosen[0.25] == {"two_tower": 0.75, "popularity": 0.0, "recent_categories": 0.25}
    # (ties in recall: the quota of the largest share first, as without a floor)
    assert chosen[0.5] == {"two_tower": 0.25, "popularity": 0.0, "recent_categories": 0.75}
