"""dare_tf.data.feeding.memory: a split held in memory gives the same batches
assembled on the host in numpy (`host_batches`, no TensorFlow) as through
tf.data (`batches`), example for example, with further fields and the time gap."""

import numpy as np
import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.preparation.in_memory import prepare
from tests.data.storage.test_fields import FORMAT, PER_USER, field_rows, write_log


@pytest.fixture(scope="module")
def datasets(taobao, tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    prepare(FORMAT, write_log(root / "log.csv", field_rows()), str(root / "fields"), PER_USER)
    return {"taobao": taobao, "fields": str(root / "fields")}


@pytest.mark.parametrize("name", ["taobao", "fields"])
@pytest.mark.parametrize("max_len", [7, 60])
def test_host_batches_equal_the_tf_data_batches(datasets, name, max_len):
    split = InMemorySplit.load(datasets[name], "train", max_len=max_len)
    order = split.epoch_order(seed=3, epoch=1)[:300]
    host = list(split.host_batches(order, 64))
    tf_batches = list(split.batches(order, 64))
    assert len(host) == len(tf_batches) == 5  # (the last one partial)
    for (x, y), (tx, ty) in zip(host, tf_batches):
        assert sorted(x) == sorted(tx)
        for key in x:
            np.testing.assert_array_equal(x[key], tx[key].numpy(), err_msg=key)
            assert x[key].dtype == np.int32
        np.testing.assert_array_equal(y, ty.numpy())
    if name == "fields":
        assert {"hist_time_gap", "hist_brand", "target_brand"} <= set(host[0][0])
