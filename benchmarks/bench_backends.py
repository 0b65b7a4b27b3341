r"""The trainer on JAX against the trainer on TensorFlow: the same flags, 3 seeds
each, test AUC mean, standard error and the difference against two standard
errors of the difference, for DARE and TWIN on the Taobao sample (or the log the
package generates like it, where the sample is absent) and on a generated log.

  python benchmarks/bench_backends.py [--work_dir DIR] [--json PATH]

Each cell is one `python -m trainers.train` run (its `results.json`), the JAX
one with `KERAS_BACKEND=jax`; docs/gpu.md's equivalence table is generated from
results/bench_backends.json (benchmarks/tables.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, run_program, write_json  # noqa: E402

SEEDS = "0,1,2"
MODELS = ("dare", "twin")
# Both datasets are small: a batch of 128 over 3 epochs gives each run over a hundred steps.
SETTINGS = ["--batch_size=128", "--epochs=3", "--eval_batch_size=4096", f"--seeds={SEEDS}", "--verbose=0"]
SAMPLE = os.path.join(REPO, "..", "shared", "data", "taobao", "UserBehavior_sample.csv")


def datasets(work: str) -> dict[str, str]:
    """Prepared directories by name: the Taobao sample (generated like it where absent) and a synthetic log."""
    out = {}
    sample = SAMPLE if os.path.exists(SAMPLE) else os.path.join(work, "taobao_sample_like.csv")
    if sample != SAMPLE:
        run_program(["data.synthetic", "--like=taobao", "--sample", f"--output={sample}"], sample + ".log")
    logs = {"taobao_sample" if sample == SAMPLE else "taobao_sample_like": sample,
            "synthetic": os.path.join(work, "synthetic.csv")}
    run_program(["data.synthetic", "--users=600", "--seed=0", f"--output={logs['synthetic']}"],
                logs["synthetic"] + ".log")
    for name, log in logs.items():
        out[name] = os.path.join(work, "prepared", name)
        run_program(["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={out[name]}"],
                    out[name] + ".log")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_backends-")
    os.makedirs(os.path.join(work, "prepared"), exist_ok=True)
    os.makedirs(os.path.join(work, "runs"), exist_ok=True)
    rows = []
    for name, data_dir in datasets(work).items():
        for model in MODELS:
            row = {"dataset": name, "model": model}
            for backend in ("tensorflow", "jax"):
                out = os.path.join(work, "runs", f"{name}-{model}-{backend}")
                os.environ["KERAS_BACKEND"] = backend
                seconds = run_program(["trainers.train", f"--model={model}", f"--data_dir={data_dir}",
                                       f"--output_dir={out}", *SETTINGS], out + ".log")
                with open(os.path.join(out, "results.json")) as f:
                    aucs = [s["test"]["auc"] for s in json.load(f)["per_seed"]]
                mean = sum(aucs) / len(aucs)
                sd = math.sqrt(sum((a - mean) ** 2 for a in aucs) / (len(aucs) - 1))
                row.update({f"{backend}_auc": mean, f"{backend}_se": sd / math.sqrt(len(aucs)),
                            f"{backend}_aucs": aucs, f"{backend}_s": seconds})
            os.environ.pop("KERAS_BACKEND")
            row["difference"] = row["jax_auc"] - row["tensorflow_auc"]
            row["two_se"] = 2 * math.hypot(row["tensorflow_se"], row["jax_se"])
            row["within_noise"] = abs(row["difference"]) <= row["two_se"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_table(rows, ["dataset", "model", "tensorflow_auc", "jax_auc", "difference", "two_se", "within_noise",
                       "tensorflow_s", "jax_s"])
    write_json("bench_backends", {"settings": SETTINGS, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
