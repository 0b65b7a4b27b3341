"""A full disk ends a trainer or an export with one line, keeping what was written
(before: the trainer segfaulted in h5py, the export printed a traceback)."""

import os
import subprocess

import pytest

from dare_tf._files import require_space
from tests.programs import run_program


def test_require_space_refuses_in_one_line(tmp_path, monkeypatch):
    import errno
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100 << 20, 99 << 20, 1 << 20))
    with pytest.raises(OSError, match=f"^{tmp_path}: 1.0 MiB free, but the SavedModel needs about 15.0 MiB; free "
                       "some space and run it again$") as caught:
        require_space(str(tmp_path), 10 << 20, "the SavedModel")
    assert caught.value.errno == errno.ENOSPC
    with pytest.raises(OSError, match="but nothing needs about 4.0 MiB"):  # the margin alone
        require_space(str(tmp_path), 0, "nothing")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100 << 20, 0, 100 << 20))
    require_space(str(tmp_path), 10 << 20, "the SavedModel")


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MiB file system (tmpfs; skipped where this process may not mount one)."""
    path = tmp_path / "small"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12M", "tmpfs", str(path)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]})")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)


def _program(program, *args):
    return run_program(program, *args)


@pytest.mark.slow
def test_a_full_disk_ends_training_and_export_in_one_line(taobao, tmp_path, small_disk):
    # The best weights of the Taobao-sample-like log's DARE do not fit in 12 MiB with the margin.
    run = small_disk / "run"
    done = _program("trainers.train", f"--data_dir={taobao}", f"--output_dir={run}", "--max_steps=4",
                    "--eval_every=2", "--nojit_compile", "--verbose=0", "--seeds=0")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {run}/seed_0: ") and lines[0].endswith(
        "saving the best weights needs about 13.2 MiB; free some space and run it again"), done.stderr[-3000:]
    assert sorted(os.listdir(run / "seed_0")) == ["history.jsonl"]  # no half-written weights file
    # A finished run exported onto the full file system: one line, no staging directory left.
    elsewhere = tmp_path / "run"
    assert _program("trainers.train", f"--data_dir={taobao}", f"--output_dir={elsewhere}", "--max_steps=2",
                    "--eval_every=2", "--nojit_compile", "--verbose=0", "--seeds=0").returncode == 0
    exports = small_disk / "exports"
    (small_disk / "filler").write_bytes(b"\0" * (6 << 20))
    done = _program("serving.export", f"--run_dir={elsewhere}", f"--export_base={exports}", "--model_name=dare")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {exports}/dare: ") and lines[0].endswith(
        "the SavedModel needs about 13.2 MiB; free some space and run it again"), done.stderr[-3000:]
    assert os.listdir(exports / "dare") == [".dare_tf_export"]  # its marker; no version, no staging
