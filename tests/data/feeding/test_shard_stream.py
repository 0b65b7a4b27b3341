"""dare_tf.data.feeding.shard_stream: a split streamed from its shards without
TensorFlow holds every record once per epoch, in file order as read_examples
reads it or in a training order fixed by seed and epoch, resumes at any example
as if it had not stopped, and holds a bounded part of the split at a time."""

import numpy as np
import pytest

from dare_tf.data.feeding import shard_stream
from dare_tf.data.feeding.shard_stream import ShardStream, take
from dare_tf.data.storage.spec import DatasetSpec
from dare_tf.data.storage.store import ShardError, load_store, read_examples
from tests.data.feeding.test_memory import datasets  # noqa: F401 (the fixture)


def stream_of(data_dir, split="train", **kw) -> ShardStream:
    spec = DatasetSpec.load(data_dir)
    return ShardStream(data_dir, split, spec, load_store(data_dir, spec), **kw)


def joined(chunks) -> dict:
    chunks = list(chunks)
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def records(columns) -> list[tuple]:
    return sorted(zip(*(columns[k].tolist() for k in sorted(columns))))


@pytest.mark.parametrize("name", ["taobao", "fields"])
def test_file_order_is_read_examples(datasets, name):  # noqa: F811
    data_dir = datasets[name]
    spec = DatasetSpec.load(data_dir)
    for split in ("train", "test"):
        got, want = joined(stream_of(data_dir, split).in_order()), read_examples(data_dir, split, spec)
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_an_epoch_is_every_record_once_in_an_order_fixed_by_seed_and_epoch(datasets):  # noqa: F811
    stream = stream_of(datasets["taobao"], shuffle_buffer=500)
    everything = joined(stream.in_order())
    windows = list(stream.shuffled(seed=3, epoch=1))
    assert [len(w["uid"]) for w in windows[:-1]] == [500] * (len(windows) - 1) and len(windows[-1]["uid"]) <= 500
    epoch = joined(windows)
    assert records(epoch) == records(everything) and len(epoch["uid"]) == len(stream) == len(everything["uid"])
    again = joined(stream.shuffled(seed=3, epoch=1))
    assert all((again[k] == epoch[k]).all() for k in epoch)
    other = joined(stream.shuffled(seed=3, epoch=2))
    assert records(other) == records(epoch) and not (other["uid"] == epoch["uid"]).all()
    assert not (epoch["position"] == everything["position"]).all()  # (shuffled, not file order)


@pytest.mark.parametrize("skip", [0, 1, 499, 1000, 1999])
def test_a_resumed_stream_reads_what_the_uninterrupted_one_read_from_there(datasets, skip):  # noqa: F811
    """`epochs`: each epoch its first `per_epoch` examples in training order, epoch after
    epoch; from example `skip` on, what the stream from 0 gives from there."""
    stream = stream_of(datasets["taobao"], shuffle_buffer=300)
    per_epoch = 1000
    whole = joined(stream.epochs(seed=0, epochs=2, per_epoch=per_epoch))
    assert len(whole["uid"]) == 2 * per_epoch
    for e in range(2):
        first = joined(take(stream.shuffled(0, e), [per_epoch]))
        np.testing.assert_array_equal(whole["position"][e * per_epoch: (e + 1) * per_epoch], first["position"])
    resumed = joined(stream.epochs(seed=0, epochs=2, per_epoch=per_epoch, skip=skip))
    for k in whole:
        np.testing.assert_array_equal(resumed[k], whole[k][skip:], err_msg=k)


def test_take_cuts_into_the_sizes_asked_the_last_piece_shorter():
    chunks = [{"uid": np.arange(a, b)} for a, b in ((0, 3), (3, 4), (4, 10))]
    assert [p["uid"].tolist() for p in take(chunks, [2, 4, 5, 5])] == [[0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
    assert [p["uid"].tolist() for p in take(chunks, [5, 5, 5])] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert list(take([], [3])) == []


def test_at_most_cycle_shards_are_read_before_the_first_window(datasets, monkeypatch):  # noqa: F811
    stream = stream_of(datasets["taobao"], shuffle_buffer=100)
    assert len(stream.names) > shard_stream.CYCLE  # (the fixture's shards: more than are read at once)
    read, calls = stream.read, []
    monkeypatch.setattr(stream, "read", lambda name: (calls.append(name), read(name))[1])
    first = next(stream.shuffled(seed=0, epoch=0))
    assert len(first["uid"]) == 100 and len(calls) == shard_stream.CYCLE


def test_a_shard_pointing_past_the_store_is_named(datasets):  # noqa: F811
    data_dir = datasets["taobao"]
    spec = DatasetSpec.load(data_dir)
    store = load_store(data_dir, spec)
    short = type(store)(store.items, store.categories, store.start, np.zeros_like(store.length))
    stream = ShardStream(data_dir, "train", spec, short)
    with pytest.raises(ShardError) as e:
        next(stream.in_order())
    assert str(e.value).startswith(f"{data_dir}/{stream.names[0]}: example 0 (user ")
    assert str(e.value).endswith("points past its user's stored sequence: store and examples do not match")


def test_unknown_split_and_bad_buffer_are_refused(datasets):  # noqa: F811
    spec = DatasetSpec.load(datasets["taobao"])
    with pytest.raises(KeyError) as e:
        ShardStream(datasets["taobao"], "dev", spec)
    assert "no split 'dev'; splits: ['test', 'train', 'val']" in str(e.value)
    with pytest.raises(ValueError) as e:
        ShardStream(datasets["taobao"], "train", spec, shuffle_buffer=0)
    assert str(e.value) == "shuffle_buffer must be >= 1, got 0"
