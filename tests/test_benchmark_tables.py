"""benchmarks/tables.py: the README's and docs' benchmark tables are the results JSON's."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_benchmark_tables_are_generated_from_the_results():
    result = subprocess.run([sys.executable, os.path.join("benchmarks", "tables.py"), "--check"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_marked_table_is_rendered_from_its_rows(tmp_path, monkeypatch):
    sys.path.insert(0, REPO)
    from benchmarks import tables

    payload = {"train": [{"input": "streamed", "train_samples_per_s": 5612.4, "vs_previous": 0.8861,
                          "rounds": [5153, 6071], "steps": 1336, "test_auc": 0.93624, "peak_rss_mb": 2211.3}],
               "written": "2026-11-24T11:00:00", "machine": {"platform": "Linux-x", "cpus": 2},
               "command": "python benchmarks/bench_data.py --parts train"}
    text = "before\n<!-- table:bench_data/train -->\nold\n<!-- /table -->\nafter\n"
    out = tables.render_marks(text, {"bench_data": payload})
    assert out.startswith("before\n<!-- table:bench_data/train -->\ntrainer samples/s") and out.endswith(
        "<!-- /table -->\nafter\n")
    assert "| streamed | 5,612 | 0.886 | 5153, 6071 | 1336 | 0.936 | 2,211 |" in out
    assert "Measured 2026-11-24T11:00:00 on Linux-x (2 CPUs): `python benchmarks/bench_data.py --parts train`." in out
    assert tables.render_marks(text, {}) == text  # no results: the marks stay as they are
