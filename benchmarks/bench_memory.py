"""Where a small training run's memory goes: the resident set (RSS) of one
`trainers.train`-equivalent run on the Taobao sample (`dare_tf.training.train`,
the trainer's defaults except the batch, as docs/data.md's walkthrough trains),
measured after each stage in its own process: the interpreter with numpy,
TensorFlow imported, Keras and dare_tf loaded, the data read and the model
built (training begins), the first step (traced and compiled), the end of
training (every validation done) and the test evaluation; the peak. Beside the
default (XLA, in-memory splits), the same run without XLA and streamed.

Usage: python benchmarks/bench_memory.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_parts  # noqa: E402

SAMPLE = os.path.join(REPO, "..", "shared", "data", "taobao", "UserBehavior_sample.csv")
BATCH = 256
CONFIGS = {"default": {}, "no_xla": {"jit_compile": False}, "streamed": {"in_memory_mb": 0}}

CHILD = r"""
import json, os, resource, sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
stages = {"python_numpy": None}
import numpy
stages["python_numpy"] = rss()
import tensorflow
stages["tensorflow"] = rss()
import dare_tf, keras
dare_tf.load()
stages["keras_dare_tf"] = rss()
from dare_tf.training import TrainConfig, train
from dare_tf.training.engines.tensorflow import loop
original = loop.SeedRun.callbacks
class Probe(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        stages["data_and_model"] = rss()
    def on_train_batch_end(self, batch, logs=None):
        stages.setdefault("first_step", rss())
    def on_epoch_end(self, epoch, logs=None):
        stages["trained"] = rss()
loop.SeedRun.callbacks = lambda self: original(self) + [Probe()]
data_dir, run_dir, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
train(data_dir, run_dir, TrainConfig.create(preset="dare", batch_size=int(sys.argv[4]), verbose=0, **overrides),
      report=lambda line: None)
stages["tested"] = rss()
stages["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT", json.dumps(stages))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as work:
        data_dir = os.path.join(work, "data")
        subprocess.run([sys.executable, "-m", "data.prepare", "--dataset=taobao", f"--input={SAMPLE}",
                        f"--output_dir={data_dir}"], cwd=REPO, check=True, capture_output=True)
        from dare_tf.data.storage.spec import DatasetSpec

        examples = DatasetSpec.load(data_dir).counts["train"]
        for name, overrides in CONFIGS.items():
            done = subprocess.run([sys.executable, "-c", CHILD, data_dir, os.path.join(work, name),
                                   json.dumps(overrides), str(BATCH)], cwd=REPO, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{name}: {done.stderr[-3000:]}")
            stages = json.loads(done.stdout.split("RESULT ", 1)[1])
            row = {"run": name, "train_examples": examples, "batch": BATCH,
                   **{f"{k}_mib": round(v) for k, v in stages.items()}}
            order = list(stages)[:-1]
            row.update({f"+{k}": round(stages[k] - stages[p]) for p, k in zip(order, order[1:])})
            rows.append(row)
            print(row, flush=True)
    print_table(rows, list(rows[0]))
    write_parts("bench_memory", {"stages": rows}, ["stages"], args.json)


if __name__ == "__main__":
    main()
