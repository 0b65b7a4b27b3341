"""benchmarks/tables.py: the README's and docs' benchmark tables are the results JSON's."""

import os
import subprocess
import sys

import pytest

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


def _seed(auc_gap, ndcg, ratio, share, ami, steps):
    """One seed's numbers as bench_paper reads them (results.json's and analysis.json's keys)."""
    analysis = {
        "retrieval": {"paper": {"ndcg": ndcg, "population": {}}, "ndcg": ndcg, "k": {"dare": 20}},
        "attention": {"rank_correlation": {"dare": 0.5, "twin": 0.4}},
        "gradients": {"by_model": {m: {"paper": {"norm_ratio": ratio, "conflict_share": share},
                                       "norm_ratio": ratio, "conflict_share": share} for m in ("twin", "dare")}},
        "representation": {"mutual_information": {m: {"10": ami[m][0], "100": ami[m][1]} for m in ami}},
        "convergence": {"steps_to_reference_best": steps}}
    results = {m: {"test": {"auc": 0.9 + (auc_gap if m == "dare" else 0)}} for m in ("dare", "twin", "din")}
    return {"analysis": analysis, "results": results}


def test_the_papers_claims_are_decided_over_the_seeds_against_their_noise():
    """Each claim's mean over seeds, its standard error, and the verdict: beyond two standard
    errors, across every k, within 2x of the paper's ratio, beyond one validation interval."""
    sys.path.insert(0, REPO)
    from benchmarks.paper_claims import claims, mean_se

    seeds = {s: _seed(auc_gap=0.01 + 0.001 * s, ndcg={"dare": 0.5 + 0.1 * (-1) ** s, "twin": 0.5},
                      ratio=4.0 + s, share=0.3 + 0.01 * s,
                      ami={"dare": (0.02, 0.01 + 0.001 * s), "twin": (0.01, 0.01)},
                      steps={"dare": None if s == 1 else 300 + 10 * s, "twin": 400}) for s in range(3)}
    rows = {(r["claim"], r["statistic"][:12]): r for r in claims(seeds, {"dare": 0.93, "twin": 0.92, "din": 0.91})}
    by_claim = {}
    for (claim, _), row in rows.items():
        by_claim.setdefault(claim, []).append(row)
    auc = by_claim["test AUC"][0]
    assert auc["dare_minus_twin"] == "0.0110 ± 0.0006" and auc["verdict"] == "holds" and auc["seeds"] == 3
    assert mean_se([0.01, 0.011, 0.012]) == pytest.approx((0.011, 0.001 / 3 ** 0.5))  # std (ddof 1) / sqrt(n)
    assert mean_se([0.5, None, float("nan")]) == (0.5, None)  # one finite value: no standard error
    paper_ndcg = by_claim["search stage against the MI truth"][0]  # +0.1, -0.1, +0.1: within its noise
    assert paper_ndcg["verdict"] == "not distinguishable"
    domination = by_claim["gradient domination (representation / attention)"][0]  # 4, 5, 6: inside 2.5 to 10
    assert domination["twin"] == "5.0000 ± 0.5774" and domination["verdict"] == "holds"
    assert by_claim["gradient conflict (TWIN)"][0]["verdict"] == "does not reproduce"  # 0.3: most steps agree
    representation = by_claim["representation: k-means clusters explain the label"][0]
    assert representation["verdict"] == "not distinguishable"
    assert "beyond 2 SE at 1 of 2 k" in representation["statistic"]
    # DARE never reaches TWIN's best in seed 1: the difference pairs seeds 0 and 2 only (-100, -80), and
    # 90 steps sooner is within one validation interval.
    convergence = by_claim["convergence"][0]
    assert convergence["dare"] == "310 ± 10" and convergence["dare_minus_twin"] == "-90 ± 10"
    assert convergence["verdict"] == "not distinguishable" and "DARE in 2 of 3 seeds" in convergence["statistic"]



def test_the_attention_dimension_cut_is_read_over_the_seeds():
    """Per width: test AUC, its drop from the widest paired by seed, the search time and its ratio."""
    sys.path.insert(0, REPO)
    from benchmarks.paper_claims import dimension_cut

    def rows(seed):
        return {"rows": [{"attention_dim": w, "representation_dim": 16, "test_auc": auc,
                          "search_us_per_example": us} for w, auc, us in
                         ((16, 0.94 + 0.001 * seed, 4.0), (8, 0.94 + 0.001 * seed - 0.0001 * (-1) ** seed, 2.0),
                          (4, 0.93 + 0.001 * seed, 1.0))]}

    table = {r["attention_dim"]: r for r in dimension_cut({s: {"dimensions": rows(s)} for s in range(3)})}
    assert list(table) == [16, 8, 4] and table[16]["auc_minus_width_16"] == "0.0000 ± 0.0000"
    assert table[8]["almost_no_auc"] == "holds (within noise)"  # -0.0001, +0.0001, -0.0001
    assert table[4]["auc_minus_width_16"] == "-0.0100 ± 0.0000" and table[4]["almost_no_auc"] == "costs AUC"
    assert table[8]["search_time_over_width_16"] == "0.50 ± 0.00" and table[4]["seeds"] == 3


def test_the_jax_trainer_reaches_the_tensorflow_trainers_auc_within_the_seeds_noise():
    """Issue 60 (3): the committed equivalence table (benchmarks/bench_backends.py, 3 seeds per
    backend; docs/gpu.md's table is generated from it) holds DARE and TWIN on both logs, and
    every difference of test AUC is within two standard errors of the difference."""
    import json
    import math

    with open(os.path.join(REPO, "benchmarks", "results", "bench_backends.json")) as f:
        rows = json.load(f)["rows"]
    assert {(r["dataset"].replace("_like", ""), r["model"]) for r in rows} == {
        (d, m) for d in ("taobao_sample", "synthetic") for m in ("dare", "twin")}
    for r in rows:
        assert len(r["tensorflow_aucs"]) == len(r["jax_aucs"]) == 3
        se = [math.sqrt(sum((a - sum(x) / 3) ** 2 for a in x) / 2 / 3) for x in (r["tensorflow_aucs"], r["jax_aucs"])]
        two_se = 2 * math.hypot(*se)
        difference = sum(r["jax_aucs"]) / 3 - sum(r["tensorflow_aucs"]) / 3
        assert abs(difference) <= two_se and abs(two_se - r["two_se"]) < 1e-12, r
