"""dare_tf.training.checkpoints (JaxCheckpoints, restore_newest): what is written reads back whole, a
damaged newest checkpoint (cut short, empty, random bytes) is passed over for the
older one, saying which, and where none reads, one line names every file (issue 66, 3)."""

import os

import keras
import numpy as np
import pytest

pytest.importorskip("jax")

from dare_tf.training.checkpoints import DamagedCheckpointError, JaxCheckpoints  # noqa: E402


def variables(value):
    return [keras.Variable(np.full((3, 2), value, "float32"), name="table"),
            keras.Variable(np.full((4,), value, "float32"), name="bias")]


@pytest.fixture
def two(tmp_path):
    """A directory with the checkpoints of steps 10 (values 1) and 20 (values 2)."""
    store = JaxCheckpoints(str(tmp_path))
    for step, value in ((10, 1.0), (20, 2.0)):
        store.save(step, variables(value), best_auc=0.5 + value / 10, best_step=step)
        store.wait()
    return store


def damage(path, how):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        if how == "member":  # one byte of the first array's data flipped: the archive reads, the member does not
            at = data.index(np.float32(2).tobytes())
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
        f.write({"cut": data[: len(data) // 2], "empty": b"", "random": np.random.default_rng(0).bytes(5000),
                 "member": data}[how])


def test_a_checkpoint_reads_back_its_values_and_scalars(two):
    restored, said = variables(0.0), []
    assert two.restore_latest(restored, said.append) == {"best_auc": 0.7, "best_step": 20.0}
    assert said == [] and all((v.numpy() == 2).all() for v in restored)
    assert sorted(os.listdir(two.directory)) == ["ckpt-10.npz", "ckpt-20.npz"]


@pytest.mark.parametrize("how, reason", [("cut", "not an .npz archive: {size} bytes"),
                                         ("empty", "not an .npz archive: 0 bytes"),
                                         ("random", "not an .npz archive: 5000 bytes"),
                                         ("member", "BadZipFile: Bad CRC-32 for file 'v0.npy'")])
def test_a_damaged_newest_checkpoint_is_named_and_the_older_one_restored(two, how, reason):
    newest = os.path.join(two.directory, "ckpt-20.npz")
    damage(newest, how)
    restored, said = variables(0.0), []
    assert two.restore_latest(restored, said.append)["best_step"] == 10
    reason = reason.format(size=os.path.getsize(newest))
    assert said == [f"warning: {newest}: not a readable checkpoint ({reason}); resuming from the older ckpt-10.npz"]
    assert all((v.numpy() == 1).all() for v in restored)


def test_where_no_checkpoint_reads_one_line_names_each_and_nothing_is_assigned(two):
    for step in (10, 20):
        damage(os.path.join(two.directory, f"ckpt-{step}.npz"), "cut")
    restored = variables(0.0)
    with pytest.raises(DamagedCheckpointError) as e:
        two.restore_latest(restored, print)
    d, size = two.directory, os.path.getsize(os.path.join(two.directory, "ckpt-10.npz"))
    assert str(e.value) == (f"{d}/ckpt-20.npz: not a readable checkpoint (not an .npz archive: {size} bytes) "
                            f"and {d}/ckpt-10.npz: not a readable checkpoint (not an .npz archive: {size} bytes): no "
                            "checkpoint to resume from (remove them to start the seed again)")
    assert all((v.numpy() == 0).all() for v in restored)


def test_another_models_checkpoint_is_refused_not_passed_over(two):
    with pytest.raises(ValueError, match=r"ckpt-20.npz: holds 2 variables; the run's model and optimizer have 1"):
        two.restore_latest(variables(0.0)[:1], print)


def test_a_killed_writers_temporary_file_is_removed_when_the_run_opens_its_checkpoints(two):
    leftover = os.path.join(two.directory, "ckpt-30.npz.tmp-17210.npz")
    mine = os.path.join(two.directory, "notes.txt")
    for path in (leftover, mine):
        open(path, "wb").write(b"x" * 100)
    JaxCheckpoints(two.directory)
    assert sorted(os.listdir(two.directory)) == ["ckpt-10.npz", "ckpt-20.npz", "notes.txt"]


class OtherProcess:
    """`EveryProcess` as seen by one process of a pair whose other process holds the steps
    `held` and reads only those in `reads` (the collectives, without them)."""

    def __init__(self, held, reads):
        self.held, self.reads, self.asked = held, reads, []

    def common(self, steps):
        return sorted(set(steps) & set(self.held))

    def all(self, ok):
        self.asked.append(ok)
        return ok and self.step_asked() in self.reads

    def step_asked(self):
        return sorted(self.held, reverse=True)[len(self.asked) - 1]


def test_processes_resume_at_the_newest_step_every_one_holds_saying_so(two):
    """A pair one of whose processes ended before writing step 20: both resume at 10; where
    the other holds nothing, both start again (before this, each resumed at its own newest,
    and the pair's collectives no longer matched: the two-process test's flake)."""
    restored, said = variables(0.0), []
    assert two.restore_latest(restored, said.append, OtherProcess([10], reads=[10]))["best_step"] == 10
    assert said == [f"warning: {two.directory}/ckpt-20.npz: not every process of the run holds step 20 (one ended "
                    "before writing it); resuming from ckpt-10.npz"]
    assert all((v.numpy() == 1).all() for v in restored)
    said.clear()
    assert two.restore_latest(variables(0.0), said.append, OtherProcess([], reads=[])) is None
    assert said == [f"warning: {two.directory}/ckpt-20.npz: not every process of the run holds step 20 (one ended "
                    "before writing it); resuming from the start"]
    said.clear()
    assert two.restore_latest(variables(0.0), said.append, OtherProcess([10, 20], reads=[10, 20]))["best_step"] == 20
    assert said == []


def test_a_step_another_process_cannot_read_is_passed_over_by_every_process(two):
    restored, said = variables(0.0), []
    other = OtherProcess([10, 20], reads=[10])
    assert two.restore_latest(restored, said.append, other)["best_step"] == 10
    assert other.asked == [True, True]
    assert said == [f"warning: {two.directory}/ckpt-20.npz: another process of the run cannot read its checkpoint "
                    "of this step; resuming from the older ckpt-10.npz"]
    assert all((v.numpy() == 1).all() for v in restored)
