"""The merged candidates earn their place on two planted logs of different kinds."""

import os

import pytest


@pytest.mark.slow
@pytest.mark.tfrs  # tensorflow-recommenders: tf.keras as Keras 2 (tests/conftest.py)
@pytest.mark.parametrize("kind", ["sessions", "far_back"])
def test_merged_candidates_beat_each_source_on_planted_logs(tmp_path, kind):
    """`sessions`: the next click follows the current session and its related
    category; `far_back`: a new session returns to the category of a click 25 to 45
    steps back (of a 50-slot history). On both, merged recall@200 is at least the
    tower's and popularity's, and the tower beats popularity."""
    from dare_tf.retrieval import RetrievalConfig, train_retrieval
    from dare_tf.data.preparation.protocol import Protocol
    from dare_tf.data.preparation.in_memory import prepare
    from dare_tf.data.generation.synthetic import SyntheticConfig, write

    extra = {"sessions": {}, "far_back": dict(p_return=0.7, recall_lag=(25, 45), p_interest=0.1)}[kind]
    log = str(tmp_path / "log.csv")
    write(SyntheticConfig(users=800, items=3000, categories=60, min_length=80, max_length=160, seed=7, **extra), log)
    prepare("taobao", log, str(tmp_path / "prepared"), Protocol(min_clicks=60, max_len=50, train_targets=8))
    results = train_retrieval(str(tmp_path / "prepared"), str(tmp_path / "run"),
                              RetrievalConfig(epochs=3, batch_size=256))
    merged, sources = results["test"]["recall@200"], results["test_sources"]
    # (no candidates written for a cascade's rankers unless --cascade_candidates asks: candidate_files)
    assert not [f for f in os.listdir(tmp_path / "run") if f.startswith("candidates-")]
    assert merged >= sources["popularity"]["recall@200"] and merged >= sources["two_tower"]["recall@200"], results
    assert sources["two_tower"]["recall@200"] > sources["popularity"]["recall@200"], results
    assert results["test_popularity"] == sources["popularity"] and abs(sum(results["quotas"].values()) - 1) < 1e-9
