"""The cascade's rankers by training negatives: on each log, a retrieval run, then
rankers trained with each negative sampler, and the cascade's HitRate@10 / NDCG@10
of their reranking against the retrieval order (with the paper's test AUC beside).

    python benchmarks/bench_two_stage.py [--logs=demo,taobao,planted] [--models=dare,twin,din]
        [--negatives=prepared,retrieval:8] [--work_dir=DIR]

Logs: `demo`, the demo's synthetic log (2,000 users); `taobao`, the Taobao
sample in ../shared/data; `planted`, a synthetic log whose sessions rarely
leave their category (p_session 0.9), where the retrieval stage's
recent-categories source is strong. `prepared` is the prepared dataset's own
negatives (the paper's protocol, kept at the best validation AUC); any other
value is a `--negatives` mixture (kept at the best validation NDCG@10),
with `/softmax` for the sampled-softmax loss (`retrieval:8/softmax`).
`--seeds=0,1,2` trains each ranker with several seeds (rows give the first
seed's cascade, `evaluate_cascade`'s, and the mean and std over seeds of the
runs' own `test_cascade`). Rows go to `results/bench_two_stage.json`, one part
per log; a rerun replaces the rows of the (model, negatives, seeds) it measured
and keeps the others;
`docs/two-stage.md`'s table is generated from it (`benchmarks/tables.py`).

    python benchmarks/bench_two_stage.py --floors=0,0.25 [--logs=demo] [--models=dare]

compares the retrieval run's `--recent_floor` settings instead (part `floor`): for
each floor, a retrieval run (the same towers: the floor only restricts the quotas
chosen on validation) and a ranker trained on its candidates with the cascade's
negatives (`uniform:8,retrieval:8`), then the cascade's held-out HitRate@10 and
the retrieval order's, on the same test clicks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dare_tf import retrieval  # noqa: E402
from benchmarks.common import RESULTS_DIR, print_table, selected_parts, write_parts  # noqa: E402
from dare_tf.demo import CASCADE_TRAINING, SYNTHETIC_PROTOCOL  # noqa: E402
from dare_tf.data.feeding.negatives import parse_negatives  # noqa: E402
from dare_tf.data.preparation.protocol import Protocol  # noqa: E402
from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.generation.synthetic import SyntheticConfig, write  # noqa: E402
from dare_tf.metrics import CASCADE_CANDIDATES, CASCADE_K  # noqa: E402
from dare_tf.training import TrainConfig, train  # noqa: E402

LOGS = ("demo", "taobao", "planted")
TAOBAO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "taobao",
                      "UserBehavior_sample.csv")
# The rankers' schedule: the demo's cascade training, with each sampler.
RANKER = dict({k: v for k, v in CASCADE_TRAINING.items() if k != "negatives"}, verbose=0)


def _data(work: str, log: str) -> str:
    data_dir = os.path.join(work, log, "data")
    if os.path.exists(os.path.join(data_dir, "spec.json")):
        return data_dir
    if log == "taobao":
        prepare("taobao", TAOBAO, data_dir, Protocol())
        return data_dir
    config = SyntheticConfig(users=2000, seed=0 if log == "demo" else 1, p_session=0.6 if log == "demo" else 0.9)
    path = os.path.join(work, log, "log.csv")
    write(config, path)
    prepare("taobao", path, data_dir, SYNTHETIC_PROTOCOL)
    return data_dir


def bench_log(work: str, log: str, models, samplers, seeds=(0,)) -> list[dict]:
    data_dir = _data(work, log)
    retrieval_run = os.path.join(work, log, "retrieval")
    retrieval.train_retrieval(data_dir, retrieval_run, retrieval.RetrievalConfig(
        epochs=3, verbose=0, cascade_candidates=(CASCADE_CANDIDATES,)))  # (for the rankers trained on them)
    runs = {}
    for model in models:
        for sampler in samplers:
            negatives, _, loss = sampler.partition("/")
            name = f"{model} {sampler}"
            runs[name] = os.path.join(work, log, "rankers", model,
                                      sampler.replace(":", "-").replace(",", "_").replace("/", "_")
                                      + ("" if tuple(seeds) == (0,) else "-seeds-" + "_".join(map(str, seeds))))
            paper = negatives == "prepared"  # the paper's protocol whole: its negatives, kept by validation AUC
            # softmax: whole groups per batch
            group = 1 + sum(c for _, c in parse_negatives(negatives)) if loss == "softmax" else 1
            train(data_dir, runs[name], TrainConfig.create(
                preset=model, negatives="" if paper else negatives, loss=loss or "pointwise",
                select_by="auc" if paper else "auto", retrieval_run=retrieval_run, seeds=tuple(seeds),
                **dict(RANKER, batch_size=RANKER["batch_size"] // group * group)))
    # One evaluation directory per set of rankers (evaluate_cascade never replaces another's).
    key = hashlib.sha1(json.dumps(sorted(runs)).encode()).hexdigest()[:12]
    cascade = retrieval.evaluate_cascade(data_dir, retrieval_run, runs, os.path.join(work, log, "cascade", key),
                                         report=print)
    k, alone = CASCADE_K, cascade["retrieval"]
    rows = []
    for name, row in cascade["rankers"].items():
        model, sampler = name.split(" ", 1)
        with open(os.path.join(runs[name], "results.json")) as f:
            recorded = json.load(f)
        per_seed = [r["test_cascade"][f"hit_rate@{CASCADE_K}"] for r in recorded["per_seed"]]
        rows.append({"log": log, "model": model, "negatives": sampler, "test_auc": recorded["test"]["auc"],
                     "seeds": len(per_seed), f"seeds_hit_rate@{CASCADE_K}": float(np.mean(per_seed)),
                     f"seeds_hit_rate@{CASCADE_K}_std": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
                     f"hit_rate@{k}": row[f"hit_rate@{k}"], f"hit_rate@{k}_se": row[f"hit_rate@{k}_se"],
                     f"ndcg@{k}": row[f"ndcg@{k}"],
                     f"retrieval_hit_rate@{k}": alone[f"hit_rate@{k}"],
                     f"retrieval_ndcg@{k}": alone[f"ndcg@{k}"],
                     "ratio": row[f"hit_rate@{k}"] / alone[f"hit_rate@{k}"],
                     "vs_retrieval": row[f"hit_rate@{k}_vs_retrieval"],
                     "vs_retrieval_se": row[f"hit_rate@{k}_vs_retrieval_se"],
                     "positives": cascade["examples"]})
    return rows


MODELS = ("dare", "twin", "din")
CASCADE_NEGATIVES = "uniform:8,retrieval:8"


def bench_floors(work: str, log: str, models, floors) -> list[dict]:
    """The cascade under each `recent_floor` (see the module)."""
    data_dir = _data(work, log)
    retrieval_runs, rankers = {}, {}
    for floor in floors:
        retrieval_runs[floor] = os.path.join(work, log, f"retrieval-floor-{floor:g}")
        retrieval.train_retrieval(data_dir, retrieval_runs[floor], retrieval.RetrievalConfig(
            epochs=3, verbose=0, recent_floor=floor, cascade_candidates=(CASCADE_CANDIDATES,)))
        for model in models:
            rankers[floor, model] = os.path.join(work, log, "rankers-floor", f"{model}-floor-{floor:g}")
            train(data_dir, rankers[floor, model], TrainConfig.create(
                preset=model, negatives=CASCADE_NEGATIVES, retrieval_run=retrieval_runs[floor], **RANKER))
    rows = []
    for floor in floors:
        runs = {model: rankers[floor, model] for model in models}
        cascade = retrieval.evaluate_cascade(data_dir, retrieval_runs[floor], runs,
                                             os.path.join(work, log, "cascade-floor", f"{floor:g}"), report=print)
        with open(os.path.join(retrieval_runs[floor], "results.json")) as f:
            recorded = json.load(f)
        k, alone = CASCADE_K, cascade["retrieval"]
        for model in models:
            row = cascade["rankers"][model]
            rows.append({"log": log, "recent_floor": floor, "model": model, "negatives": CASCADE_NEGATIVES,
                         "quotas": "/".join(f"{recorded['quotas'][s]:g}" for s in ("two_tower", "popularity",
                                                                                   "recent_categories")),
                         "recall@200": recorded["test"]["recall@200"],
                         f"hit_rate@{k}": row[f"hit_rate@{k}"], f"hit_rate@{k}_se": row[f"hit_rate@{k}_se"],
                         f"retrieval_hit_rate@{k}": alone[f"hit_rate@{k}"], "positives": cascade["examples"]})
    return rows


def _key(row: dict) -> tuple:
    return row["model"], row["negatives"], row["seeds"]


def main():
    retrieval.use_keras2()  # tensorflow-recommenders needs tf.keras to be Keras 2 (Keras 3 is unaffected)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default=",".join(LOGS))
    parser.add_argument("--models", default="dare,twin,din")
    parser.add_argument("--negatives", default="prepared;uniform:8,retrieval:8",
                        help="samplers separated by ';' (a mixture uses ',': 'prepared;uniform:1,retrieval:8')")
    parser.add_argument("--seeds", default="0", help="seeds of every ranker (the table's HitRate@10 is the first "
                        "seed's, evaluate_cascade's; seeds_hit_rate@10 their mean)")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "dare_bench_two_stage"))
    parser.add_argument("--floors", default="", help="compare these --recent_floor values instead (part floor)")
    args = parser.parse_args()
    logs = selected_parts(parser, args.logs, LOGS)
    if args.floors:
        floors = [float(f) for f in args.floors.split(",")]
        rows = [r for log in LOGS if log in logs for r in bench_floors(args.work_dir, log, args.models.split(","),
                                                                       floors)]
        print_table(rows, ["log", "recent_floor", "model", "quotas", "recall@200", f"hit_rate@{CASCADE_K}",
                           f"hit_rate@{CASCADE_K}_se", f"retrieval_hit_rate@{CASCADE_K}"])
        write_parts("bench_two_stage", {"floor": rows}, ["floor"], os.path.join(RESULTS_DIR, "bench_two_stage.json"))
        return
    samplers = [s for s in args.negatives.split(";") if s]
    path = os.path.join(RESULTS_DIR, "bench_two_stage.json")
    previous = json.load(open(path)) if os.path.exists(path) else {}
    payload = {}
    for log in (log for log in LOGS if log in logs):
        rows = bench_log(args.work_dir, log, args.models.split(","), samplers, [int(s) for s in args.seeds.split(",")])
        measured = {_key(r) for r in rows}
        payload[log] = sorted([r for r in previous.get(log, []) if _key(r) not in measured] + rows,
                              key=lambda r: (MODELS.index(r["model"]) if r["model"] in MODELS else len(MODELS),
                                             r["negatives"] != "prepared", r["seeds"], r["negatives"]))
    columns = ["log", "model", "negatives", "test_auc", f"hit_rate@{CASCADE_K}", f"retrieval_hit_rate@{CASCADE_K}",
               "ratio", "vs_retrieval", "vs_retrieval_se"]
    print_table([r for rows in payload.values() for r in rows], columns)
    write_parts("bench_two_stage", payload, list(payload), path)


if __name__ == "__main__":
    main()
