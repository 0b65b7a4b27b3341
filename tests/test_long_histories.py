"""Issue 15: lifelong histories from one sequence store (data side in
tests/data/preparation/test_prepare.py, the retrieved-only step in tests/model/test_dare_model.py)."""

import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.generation.synthetic import SyntheticConfig, write
from dare_tf.training import TrainConfig, train

# A lifelong log: 100 users of 2,100 clicks; 80% of clicks from position 300 on repeat
# the user's own click 300..1,900 steps back; otherwise no user structure.
LIFELONG = SyntheticConfig(users=100, items=3000, categories=50, p_session=0.0, p_interest=0.0, p_related=0.0,
                           min_length=2100, max_length=2100, length_median=2100, length_sigma=0.0,
                           p_recall=0.8, recall_lag=(300, 1900), seed=0)


@pytest.mark.slow
def test_lifelong_log_dare_at_2000_beats_dare_at_200(tmp_path):
    log = str(tmp_path / "lifelong.csv")
    write(LIFELONG, log)
    data_dir = str(tmp_path / "prepared")
    spec = prepare("taobao", log, data_dir, Protocol(min_clicks=200, max_len=200))
    assert spec.users == 100 and spec.clicks_stored == 100 * 2100
    # The planted structure: a positive's item is in its last 2,000 behaviours far more
    # often than in its last 200 (negatives never are: the user never clicked them).
    seen = {}
    for max_len in (200, 2000):
        test = InMemorySplit.load(data_dir, "test", spec, max_len)
        f, positive = test.features, test.labels == 1
        seen[max_len] = (f["hist_items"] == f["target_item"][:, None]).any(1)
        assert not seen[max_len][~positive].any()
        seen[max_len] = seen[max_len][positive].mean()
    assert seen[2000] > 0.9 and seen[200] < 0.7, seen
    aucs = {}
    for max_len in (200, 2000):
        results = train(data_dir, str(tmp_path / f"L{max_len}"), TrainConfig.create(
            preset="dare", batch_size=256, eval_batch_size=512, epochs=3, eval_every=1000, jit_compile=False, verbose=0,
            bn_statistics_batches=5, model_overrides=dict(max_len=max_len, aux_attention="retrieved")))
        aucs[max_len] = results["test"]["auc"]
    assert aucs[2000] > aucs[200] + 0.05, aucs
