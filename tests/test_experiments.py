import csv
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from dare_tf.experiments import reproduce
from dare_tf.training import TrainConfig

from tests.conftest import ENV, REPO



@pytest.mark.slow
def test_reproduce_writes_the_table_with_seeds_ties_and_warnings(taobao, tmp_path):
    def config_for(model, dim, data_dir):
        # two seeds for DARE (mean and std over seeds), one for DIN (std n/a)
        return TrainConfig.create(preset=model, batch_size=256, eval_batch_size=512, epochs=1, eval_every=4,
                           max_steps=4, seeds=(0, 1) if model == "dare" else (0,),
                           model_overrides=dict(embedding_dim=dim, top_k=10),
                           jit_compile=False, verbose=0)

    out = str(tmp_path / "grid")
    columns, cells = reproduce([taobao], ["dare", "din"], [8], out, config_for)
    assert columns == ["taobao_sample d=8"]
    table = open(os.path.join(out, "table1.md")).read()
    assert table.startswith("Test AUC, mean (std, n seeds) over 1 or 2 seed(s) per cell\n")
    assert "| dare | " in table and "| din | " in table
    assert "(n/a, n=1) |\n" in table and ", n=2) |\n" in table and "\nBold: the best of its column" in table
    # A 4-step run is undertrained, and the table says so beneath it.
    assert re.search(r"\nWarnings \(see each run's results.json\):\n- dare(, din)? on taobao_sample d=8, seed 0: ",
                     table), table
    rows = list(csv.DictReader(open(os.path.join(out, "table1.csv"))))
    assert [r["model"] for r in rows] == ["dare", "din"]
    assert 0 < float(rows[0]["taobao_sample d=8 mean"]) < 1 and np.isfinite(float(rows[0]["taobao_sample d=8 std"]))
    assert 0 < float(rows[1]["taobao_sample d=8 mean"]) < 1
    assert rows[1]["taobao_sample d=8 std"] == ""  # DIN: one seed, no std
    assert [r["taobao_sample d=8 seeds"] for r in rows] == ["2", "1"]
    assert sorted(r["taobao_sample d=8 tied"] for r in rows) in (["0", "1"], ["1", "1"])
    # (A grid cell exported by `serving.export` and served: tests/test_programs.py, the quiet jobs.)


def test_ties_are_differences_within_two_standard_errors_of_the_best(tmp_path):
    from dare_tf.experiments import tied_with_best, write_tables

    cells = {("dare", "c"): (0.900, 0.010, 4), ("twin", "c"): (0.888, 0.010, 4),  # 0.012 <= 2 * 0.00707
             ("din", "c"): (0.880, 0.010, 4),  # 0.020 > 0.01414
             ("sdim", "c"): (0.899, 0.0, 1)}  # one seed: no standard error, no tie
    assert tied_with_best(cells, ["dare", "twin", "din", "sdim"], "c") == {"dare", "twin"}
    assert tied_with_best({("a", "c"): (0.30, 0.01, 3), ("b", "c"): (0.40, 0.01, 3)}, ["a", "b"], "c",
                          "logloss") == {"a"}
    text = write_tables(str(tmp_path), ["dare", "twin", "din", "sdim"], ["c"], cells, "auc",
                        [("dare", "c", "seed 0: w"), ("twin", "c", "seed 0: w"), ("din", "c", "seed 0: v")])
    assert "| dare | **0.90000** (0.01000, n=4) |\n| twin | **0.88800** (0.01000, n=4) |\n" in text
    assert "| din | 0.88000 (0.01000, n=4) |\n| sdim | 0.89900 (n/a, n=1) |\n" in text
    # The same warning of several runs is one line naming them.
    assert text.endswith("Warnings (see each run's results.json):\n- dare, twin on c, seed 0: w\n"
                         "- din on c, seed 0: v\n")
    assert "\nBold: the best of its column (highest AUC) and every model within two standard errors of it (a tie: " \
        "the difference is not resolved by these seeds). A column is a dataset and the embedding dimension d; a " \
        "cell, the mean (its standard deviation over seeds, n/a with one seed; n seeds).\n" in text
    ablation = write_tables(str(tmp_path / "a"), ["dare", "dare_no_tr"], ["c"], {
        ("dare", "c"): (0.9, 0.0, 1), ("dare_no_tr", "c"): (0.91, 0.0, 1)}, "auc")
    assert "\ndare_no_tr: DARE without target-aware representation (an ablation: " in ablation
    assert open(tmp_path / "table1.md").read() == text


@pytest.mark.slow
def test_mirrored_over_two_cpu_devices_matches_one_process(taobao, tmp_path):
    helper = os.path.join(REPO, "tests", "multiworker_helper.py")
    # One process trains both strategies with both optimizers.
    done = subprocess.run([sys.executable, helper, "default,mirrored", taobao, str(tmp_path / "runs"),
                           str(tmp_path / "w.npz"), "2", "adam,lazy_adam"], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for optimizer in ("adam", "lazy_adam"):
        runs = {s: np.load(tmp_path / f"w.{s}.{optimizer}.npz") for s in ("default", "mirrored")}
        assert len(runs["default"].files) > 10
        for key in runs["default"]:
            # The same tolerance, and reason, as the multi-worker test.
            np.testing.assert_allclose(runs["mirrored"][key], runs["default"][key], atol=2e-3, err_msg=optimizer)
