"""What further behaviour fields are worth: test AUC (mean and std over 3 seeds) of
DARE and TWIN trained with item and category only, with the log's further
fields, with the time gap, and with both, on two logs:

- `tmall_sample`: the Tmall sample (../shared/data) with its `seller_id` and
  `brand_id` (`data.prepare --dataset=tmall --fields=seller,brand --time_gap`);
- `synthetic_brands`: a generated log where items of a brand share a latent
  interest beyond their category (`data.synthetic --brands=...`; the brand is
  the log's sixth column).

Each dataset is prepared once with every field; the variants differ only in
the trainer's `--fields`, so every run reads the same examples. Runs are
`python -m trainers.train` with the settings below; given the `--work_dir` of
an earlier call, the trainer reuses the runs that call finished.

Usage: python benchmarks/bench_field_value.py [--parts tmall_sample,synthetic_brands] [--work_dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, run_program, selected_parts, write_parts  # noqa: E402

TMALL = os.path.join(REPO, "..", "shared", "data", "tmall", "user_log_format1_sample.csv")
PRESETS = ("dare", "twin")
SEEDS = "0,1,2"
# The brand log: 1,500 users over 200 brands, a third of the clicks planted on a user's two brands.
SYNTHETIC = ["--users=1500", "--brands=200", "--brand_interests=2", "--p_brand=0.3", "--seed=0"]
SYNTHETIC_COLUMNS = "user=0,item=1,category=2,action=3,time=4,field:brand=5"
DATASETS = {
    "tmall_sample": {"prepare": ["--dataset=tmall", "--fields=seller,brand", "--min_clicks=50", "--train_targets=10"],
                     "fields": "seller,brand"},
    "synthetic_brands": {"prepare": ["--format=csv", f"--columns={SYNTHETIC_COLUMNS}", "--click=pv",
                                     "--min_clicks=100"], "fields": "brand"},
}
TRAIN = ["--batch_size=256", "--eval_batch_size=4096", "--epochs=2", "--learning_rate=0.005", "--max_len=100",
         "--top_k=20", f"--seeds={SEEDS}", "--verbose=0"]


def bench(name: str, work: str) -> list[dict]:
    setup = DATASETS[name]
    data = os.path.join(work, name, "data")
    log = TMALL
    os.makedirs(os.path.join(work, name), exist_ok=True)
    if name == "synthetic_brands":
        log = os.path.join(work, name, "log.csv")
        run_program(["data.synthetic", f"--output={log}", *SYNTHETIC], os.path.join(work, name, "synthetic.log"))
    run_program(["data.prepare", f"--input={log}", f"--output_dir={data}", "--time_gap", *setup["prepare"]],
         os.path.join(work, name, "prepare.log"))
    rows = []
    for preset in PRESETS:
        for variant, fields in (("item+category", "none"), ("+fields", setup["fields"]), ("+time_gap", "time_gap"),
                                ("+fields+time_gap", "all")):
            out = os.path.join(work, name, f"{preset}_{fields.replace(',', '_')}")
            run_program(["trainers.train", f"--model={preset}", f"--data_dir={data}", f"--output_dir={out}",
                            f"--fields={fields}", *TRAIN], out + ".log")
            with open(os.path.join(out, "results.json")) as f:
                results = json.load(f)
            row = {"dataset": name, "model": preset, "fields": variant, "test_auc": results["test"]["auc"],
                   "test_auc_std": results["test_std"]["auc"], "seeds": len(results["seeds"])}
            rows.append(row)
            print(f"  {row}", flush=True)
    base = {r["model"]: r["test_auc"] for r in rows if r["fields"] == "item+category"}
    for row in rows:
        row["gain"] = row["test_auc"] - base[row["model"]]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(DATASETS))
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = selected_parts(parser, args.parts, tuple(DATASETS))
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_field_value_")
    payload = {}
    for name in DATASETS:
        if name in parts:
            payload[name] = bench(name, work)
            print_table(payload[name], list(payload[name][0]))
    write_parts("bench_field_value", payload, sorted(parts), args.json)


if __name__ == "__main__":
    main()
