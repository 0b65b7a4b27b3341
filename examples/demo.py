"""The demo of `make demo` as one library call (the program is `python -m trainers.demo`).

    python examples/demo.py [WORK_DIR] [DATA_DIR]   (from the repository's root)

Prepares a planted synthetic log and the Taobao sample, trains DARE, TWIN, DIN and
DARE w/o TR, compares them, exports DARE and serves it through the stand-in server,
runs the two-stage recommender and the paper's analyses (README, "make demo").
"""

import os
import sys

from dare_tf.demo import run_demo

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "..", "shared", "data", "taobao", "UserBehavior_sample.csv")

if __name__ == "__main__":
    work_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("runs", "demo")
    data_dir = sys.argv[2] if len(sys.argv) > 2 else "data"
    run_demo(work_dir, data_dir, SAMPLE)
