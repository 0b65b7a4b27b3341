"""The wall seconds of one command-line call of the serving programs, each a new
process as a user runs it: `serving.histories show`, and `serving.client
recommend` by user id and by request file, against the stand-in server on this
machine (the walkthrough of docs/serving.md: a generated log of string ids, DARE
and the retrieval model exported, the histories in LMDB). Beside each
`recommend` row, the same call with TensorFlow imported first (what every call
cost while the client's protos loaded TensorFlow), in the same run.

    python benchmarks/bench_recommend.py [--users=1500] [--repeats=5] [--work_dir=DIR]

A `--work_dir` that holds an earlier run's models and store is measured again
without preparing them anew.

Rows go to `results/bench_recommend.json`; docs/serving.md's table is generated
from it (`benchmarks/tables.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import REPO, print_table, run_program, start_standin, write_json  # noqa: E402

# The walkthrough's log and schedule (docs/serving.md, `guide-test: live-clicks`).
COLUMNS = "--columns=user=0,item=1,category=2,action=3,time=4"
WITH_TENSORFLOW = "import runpy, sys, tensorflow; sys.argv[0] = 'serving.client'; " \
                  "runpy.run_module('serving.client', run_name='__main__')"


def prepare(work: str, users: int) -> tuple[str, str]:
    """The walkthrough's models and store in `work`: (export base, store URL)."""
    log, data, exports = (os.path.join(work, p) for p in ("clicks.csv", "clicks", "exports"))
    store = f"lmdb:{os.path.join(work, 'histories')}"
    if os.path.exists(os.path.join(exports, "models.config")) and os.path.exists(store[len("lmdb:"):]):
        print(f"the models and the store of an earlier run in {work}", flush=True)
        return exports, store
    steps = [
        ["data.synthetic", f"--output={log}", f"--users={users}", "--seed=0", "--string_ids"],
        ["data.prepare", "--format=csv", "--string_ids", f"--input={log}", f"--output_dir={data}", COLUMNS,
         "--click=pv", "--min_clicks=50", "--train_targets=8"],
        ["trainers.train", "--model=dare", f"--data_dir={data}", f"--output_dir={work}/dare", "--batch_size=256",
         "--epochs=1", "--verbose=0"],
        ["serving.export", f"--run_dir={work}/dare", f"--export_base={exports}", "--model_name=dare"],
        ["trainers.train_retrieval", f"--data_dir={data}", f"--output_dir={work}/retrieval", "--epochs=3"],
        ["serving.export", f"--run_dir={work}/retrieval", f"--export_base={exports}", "--model_name=retrieval"],
        ["serving.histories", "load", f"--data_dir={data}", f"--store={store}"],
    ]
    for step in steps:
        seconds = run_program(step, os.path.join(work, f"{step[0]}.log"))
        print(f"{' '.join(step[:2])}: {seconds:.0f} s", flush=True)
    return exports, store


def timed(argv: list[str], repeats: int) -> tuple[float, str]:
    """The median wall seconds of `argv` run `repeats` times (after one unmeasured
    run that warms the page cache), and its last output."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    seconds = []
    for attempt in range(repeats + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
        if done.returncode:
            sys.exit(f"{' '.join(argv[:4])} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        if attempt:
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), done.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_recommend_")
    os.makedirs(work, exist_ok=True)
    exports, store = prepare(work, args.users)
    shown = json.loads(timed([sys.executable, "-m", "serving.histories", "show", f"--store={store}",
                              "--user_id=U000001"], 1)[1])
    request = os.path.join(work, "request.json")
    with open(request, "w") as f:
        json.dump({"hist_items": shown["items"], "hist_categories": shown["categories"]}, f)
    server, port, _ = start_standin(f"--model_config_file={exports}/models.config")
    try:
        client = [f"--server=localhost:{port}", "--model_name=dare"]
        calls = {
            "histories show": ["-m", "serving.histories", "show", f"--store={store}", "--user_id=U000001"],
            "recommend --user_id": ["-m", "serving.client", "recommend", *client, "--user_id=U000001",
                                    f"--histories={store}"],
            "recommend --request_json": ["-m", "serving.client", "recommend", *client, f"--request_json={request}"],
        }
        rows = []
        for name, argv in calls.items():
            seconds, _ = timed([sys.executable, *argv], args.repeats)
            row = {"call": name, "seconds": round(seconds, 2)}
            if argv[1] == "serving.client":
                before, _ = timed([sys.executable, "-c", WITH_TENSORFLOW, *argv[2:]], args.repeats)
                row.update(tensorflow_first_seconds=round(before, 2), ratio=round(before / seconds, 2))
            rows.append(row)
    finally:
        server.terminate()
        server.wait(30)
    print_table(rows, ["call", "seconds", "tensorflow_first_seconds", "ratio"])
    write_json("bench_recommend", {"rows": rows, "users": args.users, "repeats": args.repeats})


if __name__ == "__main__":
    main()
