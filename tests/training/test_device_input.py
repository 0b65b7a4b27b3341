"""dare_tf.training.device_input: the windows the trainer on JAX gathers on the
device equal the tf.data pipeline's, record for record (the Taobao-like sample,
a log with further fields and the time gap), and a dataset whose times span
more than int32 offsets hold is refused in one line."""

import numpy as np
import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from tests.data.feeding.test_memory import datasets  # noqa: F401 (the fixture)

jax = pytest.importorskip("jax")


def _check_windows(data_dir: str, split_name: str) -> None:
    from dare_tf.training.device_input import DeviceSplit

    split = InMemorySplit.load(data_dir, split_name, max_len=50)
    device = DeviceSplit(split)
    assemble = jax.jit(device.assemble)
    batch = min(32, len(split) // 3)
    order = split.epoch_order(seed=0, epoch=0)[: 3 * batch]
    for (x, y), rows in zip(split.batches(order, batch), order.reshape(3, batch)):
        features, labels = assemble(device.arrays, rows.astype(np.int32))
        assert sorted(features) == sorted(x)
        for key, value in features.items():
            np.testing.assert_array_equal(np.asarray(value), x[key].numpy(), err_msg=key)
        np.testing.assert_array_equal(np.asarray(labels), y.numpy())


@pytest.mark.parametrize("name", ["taobao", "fields"])
@pytest.mark.parametrize("split_name", ["train", "test"])
def test_device_windows_equal_the_pipelines(datasets, name, split_name):  # noqa: F811
    _check_windows(datasets[name], split_name)


def test_device_windows_equal_the_pipelines_on_the_real_taobao_sample(real_taobao):
    _check_windows(real_taobao, "train")


def test_times_past_int32_offsets_are_refused(datasets):  # noqa: F811
    from dare_tf.training.device_input import DeviceSplit

    split = InMemorySplit.load(datasets["fields"], "train", max_len=5)
    split.store.times = split.store.times.copy()
    split.store.times[0] -= 2**31
    with pytest.raises(ValueError) as e:
        DeviceSplit(split)
    assert str(e.value).startswith("the dataset's click times span ")
    assert str(e.value).endswith("s (68 years) the trainer on JAX holds as int32 offsets; train on TensorFlow, "
                                 "or prepare without --time_gap")
