"""dare_tf.training.engines.jax.device_input: the windows the trainer on JAX gathers on the
device equal the tf.data pipeline's, record for record (the Taobao-like sample,
a log with further fields and the time gap), and a dataset whose times span
more than int32 offsets hold is refused in one line."""

import numpy as np
import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from tests.data.feeding.test_memory import datasets  # noqa: F401 (the fixture)

jax = pytest.importorskip("jax")


def _check_windows(data_dir: str, split_name: str) -> None:
    """Issue 66 (4): the three builders of a history window, one per kind of array, equal
    on the same examples: tf.data's (`pipeline.assemble_fn`, TensorFlow tensors), numpy's
    on the host (`SequenceStore.histories`) and JAX's gathered in the jitted step
    (`DeviceSplit.assemble`), every input and the label."""
    from dare_tf.training.engines.jax.device_input import DeviceSplit

    split = InMemorySplit.load(data_dir, split_name, max_len=50)
    device = DeviceSplit(split)
    assemble = jax.jit(device.assemble)
    batch = min(32, len(split) // 3)
    order = split.epoch_order(seed=0, epoch=0)[: 3 * batch]
    for (x, y), (host, host_y), rows in zip(split.batches(order, batch), split.host_batches(order, batch),
                                            order.reshape(3, batch)):
        features, labels = assemble(device.arrays, rows.astype(np.int32))
        assert sorted(features) == sorted(x) == sorted(host)
        for key, value in features.items():
            np.testing.assert_array_equal(np.asarray(value), x[key].numpy(), err_msg=key)
            np.testing.assert_array_equal(host[key], x[key].numpy(), err_msg=key)
        np.testing.assert_array_equal(np.asarray(labels), y.numpy())
        np.testing.assert_array_equal(host_y, y.numpy())


@pytest.mark.parametrize("name", ["taobao", "fields"])
@pytest.mark.parametrize("split_name", ["train", "test"])
def test_device_windows_equal_the_pipelines(datasets, name, split_name):  # noqa: F811
    _check_windows(datasets[name], split_name)


def test_device_windows_equal_the_pipelines_on_the_real_taobao_sample(real_taobao):
    _check_windows(real_taobao, "train")


def test_times_past_int32_offsets_are_refused(datasets):  # noqa: F811
    from dare_tf.training.engines.jax.device_input import DeviceSplit

    import copy

    loaded = InMemorySplit.load(datasets["fields"], "train", max_len=5)
    store = copy.copy(loaded.store)  # (not the store every load of this dataset in this process shares)
    store.times = store.times.copy()
    store.times[0] -= 2**31
    with pytest.raises(ValueError) as e:
        DeviceSplit(InMemorySplit(loaded.columns, store, 5))
    assert str(e.value).startswith("the dataset's click times span ")
    assert str(e.value).endswith("s (68 years) the trainer on JAX holds as int32 offsets; train on TensorFlow, "
                                 "or prepare without --time_gap")


@pytest.mark.parametrize("name", ["taobao", "fields"])
def test_a_streamed_splits_chunks_equal_the_split_held_on_the_devices(datasets, name):  # noqa: F811
    """Issue 66 (2): a split past --in_memory_mb, streamed onto the store on the devices in
    chunks (padded to one size), gives record for record the windows of the split held
    there whole: in file order (evaluation) and in a training order (each call's rows)."""
    from dare_tf.data.feeding.shard_stream import ShardStream
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training.engines.jax.device_input import DeviceSplit, StreamedInput

    data_dir = datasets[name]
    spec = DatasetSpec.load(data_dir)
    whole = InMemorySplit.load(data_dir, "train", spec, max_len=50)
    template = DeviceSplit(None, store=whole.store, max_len=50)
    assert template.count == 0 and template.with_columns(whole.columns).store_arrays is template.store_arrays
    streamed = StreamedInput(ShardStream(data_dir, "train", spec, whole.store, shuffle_buffer=64), template)
    assemble = jax.jit(template.assemble)
    at = 0
    for chunk in streamed.in_order(100):
        assert chunk.arrays["column/uid"].shape == (100,) and chunk.count <= 100
        features, labels = assemble(chunk.arrays, np.arange(chunk.count, dtype=np.int32))
        x, y = next(whole.host_batches(np.arange(at, at + chunk.count), chunk.count))
        for key in x:
            np.testing.assert_array_equal(np.asarray(features[key]), x[key], err_msg=key)
        np.testing.assert_array_equal(np.asarray(labels), y)
        at += chunk.count
    assert at == len(whole)
    calls, batch = [3, 3, 1], 16
    pieces = streamed.stream.epochs(seed=5, epochs=2, per_epoch=len(whole) // batch * batch, skip=7 * batch)
    expected = np.concatenate([p["position"] for p in pieces])  # (what the epochs' stream gives from step 7)
    got = []
    for (chunk, rows), steps in zip(streamed.training(5, 2, len(whole) // batch * batch, 7 * batch, calls, batch),
                                    calls):
        assert rows.shape == (steps, batch) and chunk.arrays["column/uid"].shape == (3 * batch,)
        features, _ = assemble(chunk.arrays, rows.reshape(-1))
        got.append(np.asarray(features["hist_items"]))
        positions = np.asarray(chunk.arrays["column/position"])[rows.reshape(-1)]
        np.testing.assert_array_equal(positions, expected[sum(map(len, got[:-1])): sum(map(len, got))])
    assert sum(map(len, got)) == sum(calls) * batch
