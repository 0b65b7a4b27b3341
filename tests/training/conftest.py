"""The training tests' shared fixture: a small planted log, prepared once per worker."""

import pytest

from dare_tf.data.protocol import Protocol, prepare
from dare_tf.data.synthetic import SyntheticConfig, write


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """A small planted log: 1,200 users, 60 categories, histories of 50."""
    root = tmp_path_factory.mktemp("planted")
    log = str(root / "log.csv")
    truth = write(SyntheticConfig(users=1200, items=3000, categories=60, min_length=80, max_length=160,
                                  seed=5), log)
    out = str(root / "prepared")
    prepare("taobao", log, out, Protocol(min_clicks=60, max_len=50, train_targets=8))
    return out, truth
