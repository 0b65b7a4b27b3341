"""The README's Keras example and preset table, and examples/keras_quickstart.py, run as written."""

import os
import re

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


def test_the_keras_quickstart_example_learns_and_round_trips(capsys):
    """The script as `python examples/keras_quickstart.py` runs it (as `__main__`), in this process."""
    import runpy

    runpy.run_path(os.path.join(REPO, "examples", "keras_quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    auc = float(re.search(r"AUC (\S+)", out).group(1))
    assert auc > 0.9, out
    assert "saved and loaded: same predictions True" in out


def test_the_daily_loop_example_continues_and_the_server_switches_versions(tmp_path):
    """examples/daily_loop.py on a small generated log of 4 days: day 3 trains from
    scratch and is served as version 1; day 4 continues from it on grown vocabularies
    and the running server answers with version 2."""
    import json

    import runpy

    daily_loop = runpy.run_path(os.path.join(REPO, "examples", "daily_loop.py"))  # (its functions, not __main__)
    rows = json.loads(json.dumps(daily_loop["main"](4, str(tmp_path), users=200)))
    assert [(r["day"], r["continued"], r["served_version"]) for r in rows] == [(3, False, 1), (4, True, 2)]
    assert rows[1]["items"] >= rows[0]["items"] and 0 < rows[1]["steps"] <= 100  # (at most 100: continued)
    assert all(r["test_auc"] > 0.7 for r in rows), rows
