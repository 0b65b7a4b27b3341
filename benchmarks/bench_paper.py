"""The paper's analyses on a log where the paper's own NDCG population exists: a
Taobao-like log of the real-size generator (`data.synthetic --like=taobao
--fraction=F`, the paper's protocol), DARE, TWIN and DIN at d=16 trained with the
paper's settings, one run per seed, the analysis suite on each seed's three runs
(and DARE's attention-dimension cut), and every claim as the mean over the seeds with its standard error
(`results/bench_paper.json`; docs/analyses.md's tables, by tables.py).

Usage: python benchmarks/bench_paper.py [--fraction 0.4] [--seeds 0,1,2] [--work_dir DIR]

Killed and started again, it reuses what it finished: the log, the prepared data,
each finished run (`trainers.train` resumes its own) and each seed's analysis.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, run_program, write_parts  # noqa: E402

MODELS = ("dare", "twin", "din")
# The paper's training settings (../shared/docs/reference.md: Adam, learning rate 0.01,
# batch 2048) at d=16, for one epoch (the paper trains two), validating every 100 steps.
TRAINING = ["--embedding_dim=16", "--batch_size=2048", "--learning_rate=0.01", "--epochs=1", "--eval_every=100",
            "--verbose=0"]
# The suite: its own gradient run of TWIN (the shared tables the paper's gradient claims are
# about) at the paper's batch and learning rate, 100 steps (what the paper's statistic reads);
# every test example for the NDCG populations.
ANALYSES = "attention,retrieval,gradients,representation,convergence"
ANALYSIS = ["--batch_size=2048", "--learning_rate=0.01", "--gradient_steps=100", "--gradient_models=twin"]
# The attention-dimension cut: DARE's attention width halved twice from the representation's 16.
DIMENSIONS = (16, 8, 4)
# The paper's Table 1 (../shared/docs/paper.md): test AUC on Taobao at d=16.
PAPER_AUC = {"dare": 0.92568, "twin": 0.91688, "din": 0.90442}


def _load(*path):
    with open(os.path.join(*path)) as f:
        return json.load(f)


def prepared_log(work: str, fraction: float) -> str:
    log, data = os.path.join(work, f"taobao-{fraction:g}.csv"), os.path.join(work, f"taobao-{fraction:g}")
    if not os.path.exists(os.path.join(data, "spec.json")):
        if not os.path.exists(log):
            run_program(["data.synthetic", "--like=taobao", f"--fraction={fraction:g}", f"--output={log}"],
                        log + ".log")
        run_program(["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={data}"], data + ".log")
    return data


def run_seed(work: str, data: str, seed: int, test_examples: int) -> str:
    """Trains each model at `seed` (or reuses it) and analyses the three; the analysis directory."""
    runs = {}
    os.makedirs(os.path.join(work, f"seed_{seed}"), exist_ok=True)
    for model in MODELS:
        out = os.path.join(work, f"seed_{seed}", model)
        runs[model] = out
        if not os.path.exists(os.path.join(out, "results.json")):
            print(f"training {model}, seed {seed}", flush=True)
            run_program(["trainers.train", f"--model={model}", f"--data_dir={data}", f"--output_dir={out}",
                         f"--seeds={seed}", *TRAINING], out + ".log")
    analysis = os.path.join(work, f"seed_{seed}", "analysis")
    if not os.path.exists(os.path.join(analysis, "analysis.json")):
        print(f"analysing seed {seed}", flush=True)
        run_program(["trainers.analyze", f"--data_dir={data}", f"--output_dir={analysis}",
                     "--runs=" + ",".join(f"{m}:{p}" for m, p in runs.items()), f"--analyses={ANALYSES}",
                     f"--seed={seed}", f"--max_examples={test_examples}", *ANALYSIS], analysis + ".log")
    return analysis


def run_dimensions(work: str, data: str, seed: int) -> str:
    """DARE of `seed` at narrower attention widths (`DIMENSIONS`; the width-16 run is the
    seed's DARE run, the others trained as it was), timed and tested; the analysis directory."""
    analysis = os.path.join(work, f"seed_{seed}", "dimensions")
    if not os.path.exists(os.path.join(analysis, "analysis.json")):
        print(f"attention widths, seed {seed}", flush=True)
        dare = os.path.join(work, f"seed_{seed}", "dare")
        run_program(["trainers.analyze", f"--data_dir={data}", f"--output_dir={analysis}", f"--runs=dare:{dare}",
                     "--analyses=dimensions", f"--dimension_runs={DIMENSIONS[0]}:{dare}",
                     "--attention_dims=" + ",".join(map(str, DIMENSIONS)), f"--seed={seed}", *ANALYSIS],
                     analysis + ".log")
    return analysis


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.4)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "dare_bench_paper"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    data = prepared_log(args.work_dir, args.fraction)
    spec = _load(data, "spec.json")
    seeds = [int(s) for s in args.seeds.split(",")]
    seeds_done = {}
    for seed in seeds:
        analysis = run_seed(args.work_dir, data, seed, spec["counts"]["test"])
        seeds_done[seed] = {"analysis": _load(analysis, "analysis.json"),
                            "results": {m: _load(args.work_dir, f"seed_{seed}", m, "results.json") for m in MODELS}}
    for seed in seeds:
        seeds_done[seed]["dimensions"] = _load(run_dimensions(args.work_dir, data, seed), "analysis.json")["dimensions"]
    from benchmarks.paper_claims import claims, dimension_cut, population

    payload = {"paper_population": population(spec, args.fraction, seeds_done),
               "paper_claims": claims(seeds_done, PAPER_AUC), "paper_dimensions": dimension_cut(seeds_done)}
    for part, rows in payload.items():
        print(f"\n{part}")
        print_table(rows, list(rows[0]))
    write_parts("bench_paper", payload, list(payload), args.json)


if __name__ == "__main__":
    main()
