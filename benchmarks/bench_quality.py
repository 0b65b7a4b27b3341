"""What the models reach: the demo's results and a baselines grid, recorded from real
runs so that the guides quote them from `results/bench_quality.json` (tables.py).

Usage: python benchmarks/bench_quality.py [--parts demo,baselines,schedule,negatives] [--work_dir DIR] [--json PATH]

demo: runs `python -m trainers.demo` (a fresh work directory), then reads what it
  wrote: test AUC of every model on both datasets (`table1`), DARE's by history
  length (`by_length`), the retrieval stage's recall against most-popular
  (`retrieval`), the cascade (`cascade`), the analyses' headline numbers
  (`analyses`, `gradients`, `dimensions`) and the demo's wall time (`demo_time`);
  the analyses' figures are copied to docs/figures/.
baselines: `python -m trainers.reproduce` of DARE, TWIN, ETA, SDIM and TWIN-V2 with
  the demo's training settings, 3 seeds, on the demo's two prepared datasets
  (runs the demo part's preparation first when it is missing): test AUC mean
  and std per cell (`baselines`).
schedule: DARE with the trainer's default schedule (2 epochs, a validation every
  150 steps or fewer so that there are at least 5) at batch 256 and 2,048, on
  synthetic logs of 500 and 2,000 users (`schedule`): steps, validations, test
  AUC and the run's undertraining warnings; the README's schedule advice comes
  from this table.
negatives: the retrieval stage (`trainers.train_retrieval`, its defaults) with 0 and
  more uniformly drawn extra negatives per batch (`--uniform_negatives`), on three logs:
  the demo's synthetic log, and the two planted logs of the retrieval tests
  (`sessions`: the next click follows the session; `far_back`: a new session
  returns to a category 25-45 clicks back): recall@50 and @200 of the merged
  candidates and of the tower alone, most-popular's recall@200, the quotas chosen
  on validation (`negatives`);
  the default of `--uniform_negatives` comes from this table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, run_program, selected_parts, write_parts  # noqa: E402

DATASETS = ("synthetic", "taobao_sample")
BASELINES = ("dare", "twin", "eta", "sdim", "twin_v2")
# The demo's training settings (dare_tf.demo), as trainers.reproduce flags, with a validation
# every 60 steps (the demo validates at the default schedule, every 20 of its 101 steps).
DEMO_SETTINGS = ["--batch_size=512", "--eval_batch_size=4096", "--epochs=1", "--eval_every=60",
                 "--learning_rate=0.005", "--top_k=20"]


def _load(*path):
    with open(os.path.join(*path)) as f:
        return json.load(f)


def bench_demo(work: str) -> dict:
    demo, data = os.path.join(work, "demo"), os.path.join(work, "data")
    for path in (demo, data):
        shutil.rmtree(path, ignore_errors=True)
    seconds = run_program(["trainers.demo", f"--work_dir={demo}", f"--data_dir={data}"], os.path.join(work, "demo.log"))
    runs = {d: {m: _load(demo, d, "d16", m, "results.json") for m in sorted(os.listdir(os.path.join(demo, d, "d16")))}
            for d in DATASETS if os.path.isdir(os.path.join(demo, d))}
    models = list(next(iter(runs.values())))
    out = {"table1": [{"model": m, **{d: runs[d][m]["test"]["auc"] for d in runs}} for m in models]}
    dare = runs["synthetic"]["dare"]
    out["by_length"] = [{"history_length": "all", "examples": None, "auc": dare["test"]["auc"]}] + [
        {"history_length": name, "examples": entry["count"], "auc": entry["auc"]}
        for name, entry in dare["test_by_history_length"].items()]
    retrieval = _load(demo, "retrieval", "results.json")
    sources = retrieval["test_sources"]
    out["retrieval"] = [{"recall": k, "merged": retrieval["test"][k], "two_tower": sources["two_tower"][k],
                         "most_popular": sources["popularity"][k], "recent_categories": sources["recent_categories"][k]}
                        for k in sorted(retrieval["test"], key=lambda k: int(k.split("@")[1]))]
    cascade = _load(demo, "cascade", "cascade.json")
    n = cascade["config"]["num_candidates"]
    out["cascade"] = [{"stage": f"{name} alone", f"recall@{n}": r[f"recall@{n}"], "hit_rate@10": None,
                       "ndcg@10": None} for name, r in cascade["sources"].items()] + [
        {"stage": "retrieval alone (merged)", f"recall@{n}": cascade["retrieval"][f"recall@{n}"],
         "hit_rate@10": cascade["retrieval"]["hit_rate@10"], "ndcg@10": cascade["retrieval"]["ndcg@10"]}] + [
        {"stage": f"retrieval top {n} -> {name}", f"recall@{n}": None, "hit_rate@10": r["hit_rate@10"],
         "ndcg@10": r["ndcg@10"]} for name, r in cascade["rankers"].items()]
    analysis = _load(demo, "analysis", "analysis.json")
    for path in analysis["figures"].values():  # the guide's figures (docs/analyses.md), of this run
        shutil.copy(os.path.join(demo, "analysis", path), os.path.join(REPO, "docs", "figures"))
    rows = []
    for label in analysis["retrieval"]["ndcg"]:
        mi = analysis["representation"]["mutual_information"].get(label, {})
        rows.append({"model": label, "ndcg_k": analysis["retrieval"]["k"][label],
                     "search_ndcg_mi": analysis["retrieval"]["ndcg"][label],
                     "search_ndcg_planted": analysis["retrieval"].get("planted", {}).get("ndcg", {}).get(label),
                     "attention_spearman": analysis["attention"]["rank_correlation"].get(label),
                     "representation_ami_max": max(mi.values()) if mi else None,
                     "steps_to_twin_best": analysis["convergence"]["steps_to_reference_best"].get(label)})
    out["analyses"] = rows
    grads = analysis["gradients"]
    out["gradients"] = [{"model": grads["model"], "norm_ratio": grads["norm_ratio"],
                         "final_norm_ratio": grads.get("final_norm_ratio"), "conflict_share": grads["conflict_share"]}]
    out["dimensions"] = [{k: r[k] for k in ("attention_dim", "representation_dim", "test_auc", "search_us_per_example")}
                         for r in analysis["dimensions"]["rows"]]
    out["demo_time"] = [{"program": "python -m trainers.demo", "seconds": seconds,
                         **{f"{d} examples": sum(_load(data, "prepared", d, "spec.json")["counts"].values())
                            for d in runs}}]
    return out


def bench_baselines(work: str) -> list[dict]:
    prepared = [os.path.join(work, "data", "prepared", d) for d in DATASETS]
    if not all(os.path.exists(os.path.join(p, "spec.json")) for p in prepared):
        sys.exit(f"{prepared}: not prepared; run --parts demo first (it prepares them)")
    out = os.path.join(work, "baselines")
    shutil.rmtree(out, ignore_errors=True)
    run_program(["trainers.reproduce", f"--data_dirs={','.join(prepared)}", f"--models={','.join(BASELINES)}",
              "--dims=16", "--seeds=0,1,2", f"--output_dir={out}", *DEMO_SETTINGS], os.path.join(work, "baselines.log"))
    with open(os.path.join(out, "table1.csv")) as f:
        rows = list(csv.DictReader(f))
    return [{"model": r["model"], **{f"{d} {s}": float(r[f"{d} d=16 {s}"]) for d in DATASETS for s in ("mean", "std")},
             "seeds": 3} for r in rows]


SCHEDULE_USERS = (500, 2000)
SCHEDULE_BATCHES = (256, 2048)


# The demo's preparation of its synthetic log (dare_tf.demo.SYNTHETIC_PROTOCOL), and the retrieval tests'.
DEMO_PROTOCOL = ["--min_clicks=50", "--max_len=100", "--train_targets=10", "--stride=5"]
PLANTED_PROTOCOL = ["--min_clicks=60", "--max_len=50", "--train_targets=8"]
PLANTED_LOG = ["--users=800", "--items=3000", "--categories=60", "--min_length=80", "--max_length=160", "--seed=7"]


def _synthetic(work: str, name: str, log_flags: list[str], protocol: list[str]) -> str:
    """A prepared synthetic log in `work/name` (generated and prepared once)."""
    log, data = os.path.join(work, f"{name}.csv"), os.path.join(work, name)
    if not os.path.exists(os.path.join(data, "spec.json")):
        run_program(["data.synthetic", f"--output={log}", *log_flags], log + ".log")
        run_program(["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={data}", *protocol],
                 log + ".log")
    return data


def bench_schedule(work: str) -> list[dict]:
    rows = []
    for users in SCHEDULE_USERS:
        data = _synthetic(work, f"schedule_{users}", [f"--users={users}", "--seed=0"], DEMO_PROTOCOL)
        for batch in SCHEDULE_BATCHES:
            out = os.path.join(work, f"schedule_{users}_b{batch}")
            shutil.rmtree(out, ignore_errors=True)
            seconds = run_program(["trainers.train", "--model=dare", f"--data_dir={data}", f"--output_dir={out}",
                                f"--batch_size={batch}", "--verbose=0"], out + ".log")
            results = _load(out, "results.json")
            history = [json.loads(line) for line in open(os.path.join(out, "seed_0", "history.jsonl"))]
            rows.append({"users": users, "train_examples": _load(data, "spec.json")["counts"]["train"],
                         "batch_size": batch, "steps": results["per_seed"][0]["steps"], "validations": len(history),
                         "test_auc": results["test"]["auc"], "seconds": seconds,
                         "warnings": "; ".join(w.split(": ", 1)[1].split(":")[0].split(" (")[0]
                                               for w in results["warnings"]) or "none"})
    return rows


NEGATIVES = (0, 256, 1024)
QUOTA_ORDER = ("two_tower", "popularity", "recent_categories")


def bench_negatives(work: str) -> list[dict]:
    logs = {"demo": _synthetic(work, "schedule_2000", ["--users=2000", "--seed=0"], DEMO_PROTOCOL),
            "sessions": _synthetic(work, "planted_sessions", PLANTED_LOG, PLANTED_PROTOCOL),
            "far_back": _synthetic(work, "planted_far_back", [*PLANTED_LOG, "--p_return=0.7", "--recall_lag=25,45",
                                                              "--p_interest=0.1"], PLANTED_PROTOCOL)}
    rows = []
    for log, data in logs.items():
        for negatives in NEGATIVES:
            out = os.path.join(work, f"negatives_{log}_{negatives}")
            shutil.rmtree(out, ignore_errors=True)
            seconds = run_program(["trainers.train_retrieval", f"--data_dir={data}", f"--output_dir={out}",
                                f"--uniform_negatives={negatives}"], out + ".log")
            results = _load(out, "results.json")
            tower = results["test_sources"]["two_tower"]
            rows.append({"log": log, "negatives": negatives, "merged@50": results["test"]["recall@50"],
                         "merged@200": results["test"]["recall@200"], "tower@50": tower["recall@50"],
                         "tower@200": tower["recall@200"],
                         "popularity@200": results["test_popularity"]["recall@200"],
                         "quotas": " / ".join(f"{results['quotas'][s]:g}" for s in QUOTA_ORDER), "seconds": seconds})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="demo,baselines")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "dare_bench_quality"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = selected_parts(parser, args.parts, ("demo", "baselines", "schedule", "negatives"))
    os.makedirs(args.work_dir, exist_ok=True)
    payload = {}
    if "demo" in parts:
        payload.update(bench_demo(args.work_dir))
        for part, rows in payload.items():
            print(f"\n{part}")
            print_table(rows, list(rows[0]))
    if "baselines" in parts:
        payload["baselines"] = bench_baselines(args.work_dir)
        print_table(payload["baselines"], list(payload["baselines"][0]))
    if "schedule" in parts:
        payload["schedule"] = bench_schedule(args.work_dir)
        print_table(payload["schedule"], list(payload["schedule"][0]))
    if "negatives" in parts:
        payload["negatives"] = bench_negatives(args.work_dir)
        print_table(payload["negatives"], list(payload["negatives"][0]))
    write_parts("bench_quality", payload, list(payload))


if __name__ == "__main__":
    main()
