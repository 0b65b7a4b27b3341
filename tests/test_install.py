"""What `pip install` makes of the repository: the wheel ships the programs and the
flagfiles and runs outside the checkout; the editable install is a plain `.pth`."""

import os
import subprocess
import sys
import zipfile

import pytest

from dare_tf.cli import shipped_flagfiles
from tests.conftest import ENV, REPO


def _build(kind: str, out: str) -> str:
    """The wheel (`kind`: wheel or editable) setuptools builds from the checkout; its path."""
    done = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                           f"print(b.build_{kind}(sys.argv[1]))", out], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return os.path.join(out, done.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group("build")  # both builds write the checkout's build/ and egg-info
def test_the_wheel_ships_programs_and_flagfiles_and_runs_from_any_directory(tmp_path):
    wheel = _build("wheel", str(tmp_path))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    assert {"dare_tf/_programs/trainers/train.py", "dare_tf/_programs/data/prepare.py",
            "dare_tf/_programs/serving/export.py", "dare_tf/_programs/configs/smoke.flags",
            "dare_tf/_programs/configs/dare_taobao.flags"} <= set(names)
    assert not [n for n in names if n.split("/")[0] in ("trainers", "serving", "data", "configs")]
    # From another directory, with only the installed copy: the documented command line
    # `--flagfile=configs/smoke.flags` reads the shipped flagfile (its flags reach the
    # program, which then refuses the missing dataset in one line).
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(ENV, PYTHONPATH=str(tmp_path / "site"))
    code = ("import sys, dare_tf; assert dare_tf.__file__.startswith(sys.argv[1]), dare_tf.__file__; "
            "from dare_tf._programs.trainers import train; sys.argv = ['dare-train'] + sys.argv[2:]; train.run()")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site"), "--flagfile=configs/smoke.flags",
                           f"--data_dir={work / 'none'}", f"--output_dir={work / 'run'}"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {work / 'none'}/spec.json not found"), \
        done.stderr[-3000:]


@pytest.mark.xdist_group("build")
def test_an_editable_install_is_a_plain_pth_of_the_checkout(tmp_path):
    """No meta-path finder (setuptools warns "Editable installation" for one): the
    checkout on sys.path, `dare_tf._programs` finding the folders beside the package."""
    with zipfile.ZipFile(_build("editable", str(tmp_path))) as z:
        files = [n for n in z.namelist() if ".dist-info/" not in n]
        assert len(files) == 1 and files[0].endswith(".pth"), files
        assert z.read(files[0]).decode().split() == [REPO]
    done = subprocess.run([sys.executable, "-c", "import dare_tf._programs.trainers.train as t, "
                           "dare_tf._programs.configs as c; print(t.__file__, c.__file__)"], cwd=tmp_path,
                          env=dict(ENV, PYTHONPATH=REPO), capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == [os.path.join(REPO, "trainers", "train.py"),
                                   os.path.join(REPO, "configs", "__init__.py")], done.stderr[-2000:]


def test_a_missing_configs_flagfile_is_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = os.path.join(REPO, "configs", "smoke.flags")
    assert shipped_flagfiles(["p", "--flagfile=configs/smoke.flags", "--x=1"]) == ["p", f"--flagfile={shipped}",
                                                                                  "--x=1"]
    assert shipped_flagfiles(["p", "--flagfile", "configs/smoke.flags"]) == ["p", "--flagfile", shipped]
    # a path that exists here, another folder, or an unknown name: left to absl
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "smoke.flags").write_text("--epochs=1\n")
    for argv in (["p", "--flagfile=configs/smoke.flags"], ["p", "--flagfile=mine/smoke.flags"],
                 ["p", "--flagfile=configs/nope.flags"], ["p", "--flagfile"]):
        assert shipped_flagfiles(argv) == argv


@pytest.mark.xdist_group("build")
def test_the_core_requirements_name_no_tensorflow_package(tmp_path):
    """A GPU host trains on JAX after `pip install "dare-tf[jax]"` (docs/gpu.md): the wheel's core
    requirements name no TensorFlow package; TensorFlow, its serving API, tensorflow-recommenders
    and tf-keras come with the `tensorflow` extra. (That the trainer on JAX never imports TensorFlow:
    tests/training/test_jax_loop.py, through tests/no_tensorflow.py.)"""
    import re

    done = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                           "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metadata = (tmp_path / done.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]

    def names(extra):
        return {re.split(r"[<>=!~\[; ]", r)[0].lower() for r in requires
                if (f'extra == "{extra}"' in r if extra else "extra ==" not in r)}

    tensorflow = {"tensorflow", "tensorflow-serving-api", "tensorflow-recommenders", "tf-keras"}
    assert not names(None) & tensorflow, names(None)
    assert {"keras", "numpy", "absl-py", "google-crc32c"} <= names(None)
    assert names("tensorflow") == tensorflow and names("jax") == {"jax", "filelock"}
