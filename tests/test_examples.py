"""The README's Keras example and preset table, and examples/keras_quickstart.py, run as written."""

import os
import re
import subprocess
import sys

import numpy as np

import dare_tf
from tests.conftest import REPO

README = open(os.path.join(REPO, "README.md")).read()


def test_the_readme_keras_example_runs():
    code = re.search(r"## Keras in ten lines\n\n```python\n(.*?)```", README, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["p"].shape == (2,) and np.all((scope["p"] >= 0) & (scope["p"] <= 1))
    assert tuple(scope["out"]["positions"].shape) == (2, scope["model"].model_config.top_k)


def test_the_readme_preset_table_is_the_registry():
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| [^|]+ \| `(\w+)`", README, re.M)
    assert sorted(rows) == sorted((name, preset.get("search", "soft")) for name, preset in dare_tf.PRESETS.items())


def test_the_keras_quickstart_example_learns_and_round_trips():
    done = subprocess.run([sys.executable, os.path.join(REPO, "examples", "keras_quickstart.py")], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    auc = float(re.search(r"AUC (\S+)", done.stdout).group(1))
    assert auc > 0.9, done.stdout
    assert "saved and loaded: same predictions True" in done.stdout
