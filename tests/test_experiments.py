import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from dare_tf.experiments import reproduce
from dare_tf.training import TrainConfig, make_strategy

from tests.conftest import ENV, REPO



@pytest.mark.slow
def test_reproduce_writes_table_and_export_cli_serves_a_cell(taobao, tmp_path):
    def config_for(model, dim):
        # two seeds for DARE (mean and std over seeds), one for DIN (std n/a)
        return TrainConfig.create(preset=model, batch_size=256, eval_batch_size=512, epochs=1, eval_every=4,
                           max_steps=4, seeds=(0, 1) if model == "dare" else (0,),
                           model_overrides=dict(embedding_dim=dim, top_k=10),
                           jit_compile=False, verbose=0)

    out = str(tmp_path / "grid")
    columns, cells = reproduce([taobao], ["dare", "din"], [8], out, config_for, make_strategy("default"))
    assert columns == ["taobao_sample d=8"]
    table = open(os.path.join(out, "table1.md")).read()
    assert table.startswith("Test AUC, mean (std) over 1 or 2 seed(s) per cell\n")
    assert "| dare | " in table and "| din | " in table and table.rstrip().endswith("(n/a) |")
    rows = list(csv.DictReader(open(os.path.join(out, "table1.csv"))))
    assert [r["model"] for r in rows] == ["dare", "din"]
    assert 0 < float(rows[0]["taobao_sample d=8 mean"]) < 1 and np.isfinite(float(rows[0]["taobao_sample d=8 std"]))
    assert 0 < float(rows[1]["taobao_sample d=8 mean"]) < 1
    assert rows[1]["taobao_sample d=8 std"] == ""  # DIN: one seed, no std
    run_dir = os.path.join(out, "taobao_sample", "d8", "dare")
    done = subprocess.run([sys.executable, "-m", "serving.export", f"--run_dir={run_dir}",
                           f"--export_base={tmp_path / 'exports'}", "--model_name=dare"],
                          cwd=REPO, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(os.path.join("exports", "dare", "1"))
    assert os.path.exists(tmp_path / "exports" / "dare" / "1" / "saved_model.pb")


@pytest.mark.slow
def test_mirrored_over_two_cpu_devices_matches_one_process(taobao, tmp_path):
    helper = os.path.join(REPO, "tests", "multiworker_helper.py")
    for strategy in ("default", "mirrored"):  # each process trains with both optimizers
        done = subprocess.run([sys.executable, helper, strategy, taobao, str(tmp_path / strategy),
                               str(tmp_path / f"{strategy}.npz"), "2", "adam,lazy_adam"],
                              env=ENV, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    for optimizer in ("adam", "lazy_adam"):
        runs = {s: np.load(tmp_path / f"{s}.{optimizer}.npz") for s in ("default", "mirrored")}
        assert len(runs["default"].files) > 10
        for key in runs["default"]:
            # The same tolerance, and reason, as the multi-worker test.
            np.testing.assert_allclose(runs["mirrored"][key], runs["default"][key], atol=2e-3, err_msg=optimizer)
