"""The day-by-day loop as library calls, on a generated log of several days:

- day `first`: prepare the log of its days so far (`--split=time`: the last
  day is the test window, the day before it validation), train a ranker,
  export it (version 1) and serve it (the stand-in server, as TF Serving would);
- each next day: append the day's log to the dataset (`data.prepare
  --append`: old ids keep their dense ids, the day becomes the test window),
  continue from the previous day's run (`init_from`, a few hundred steps),
  export the next version under the same model name: the server switches to
  it without a restart.

    python examples/daily_loop.py [DAYS] [WORK_DIR]

DAYS (default 5) days of 600 generated users; everything is written under
WORK_DIR (default runs/examples/daily). Each day's row says the seconds of
each step, the run's test AUC and the version the server answered with.
The programs behind the same steps are `data.synthetic --days`,
`data.prepare --split=time`, `data.prepare --append`, `trainers.train
--init_from`, `serving.export` and `serving.standin_server` (docs/daily.md).
"""

import os
import sys
import time

from dare_tf.data.preparation.protocol import Protocol

from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.generation.synthetic import SyntheticConfig, write
from dare_tf.training import TrainConfig, train

DAY = 86_400
FIRST_DAY = 3  # the first day with a train, a validation and a test day
PROTOCOL = Protocol(split="time", min_clicks=20, partitions=2)
TRAINING = dict(preset="dare", batch_size=512, eval_batch_size=4096, epochs=1, verbose=0, jit_compile=False,
                model_overrides=dict(top_k=10, max_len=100))
CONTINUED_STEPS = 100


def days_of(log: str, first_day: int, days: range, out: str) -> str:
    """The rows of `log` on `days` (1-based; day 1 starts at `first_day`)."""
    lo, hi = first_day + (days.start - 1) * DAY, first_day + (days.stop - 1) * DAY
    with open(log) as f, open(out, "w") as kept:
        kept.writelines(line for line in f if lo <= int(line.rsplit(",", 1)[1]) < hi)
    return out


def _served_version(client) -> int | None:
    """The version the server answers with; None while it is too busy loading the new
    one to answer its metadata call in time (a deadline on a loaded 2-core machine)."""
    import grpc

    try:
        return client.served_version()
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        return None


def main(days: int = 5, work_dir: str = os.path.join("runs", "examples", "daily"), users: int = 600,
         on_day=None) -> list[dict]:
    """Runs the loop; returns a row per day. `on_day(data_dir, row)`, if given, is
    called after each day (the dataset then holds the days so far)."""
    from dare_tf.data.preparation.append import append
    from dare_tf.export import export_run
    from dare_tf.serving.client import ServingClient
    from dare_tf.testing.standin_server import serve

    os.makedirs(work_dir, exist_ok=True)
    log = os.path.join(work_dir, "log.csv")
    write(SyntheticConfig(users=users, items=5000, categories=100, min_length=40, max_length=600, days=int(days),
                          seed=3), log)
    with open(log) as f:  # (the log's first UTC day, once)
        first_day = min(int(line.rsplit(",", 1)[1]) for line in f) // DAY * DAY
    exports, server, rows, previous = os.path.join(work_dir, "exports"), None, [], None
    try:
        for day in range(FIRST_DAY, int(days) + 1):
            timings, start = {}, time.perf_counter()
            data_dir = os.path.join(work_dir, "data")
            if previous is None:
                spec = prepare("taobao", days_of(log, first_day, range(1, day + 1), os.path.join(
                    work_dir, f"days_1_to_{day}.csv")), data_dir, PROTOCOL)
            else:
                spec = append(days_of(log, first_day, range(day, day + 1), os.path.join(work_dir, f"day_{day}.csv")),
                              data_dir)
            timings["data_s"] = time.perf_counter() - start
            run = os.path.join(work_dir, f"day_{day}", "run")
            start = time.perf_counter()
            steps = {} if previous is None else dict(init_from=previous, max_steps=CONTINUED_STEPS,
                                                     eval_every=CONTINUED_STEPS // 2)
            results = train(data_dir, run, TrainConfig.create(**TRAINING, **steps))
            timings["train_s"] = time.perf_counter() - start
            start = time.perf_counter()
            version = int(os.path.basename(export_run(run, exports, "dare")))
            timings["export_s"] = time.perf_counter() - start
            start = time.perf_counter()
            if server is None:
                server, port, _ = serve({"dare": os.path.join(exports, "dare")}, 0, poll_s=0.5)
                client = ServingClient(f"localhost:{port}", "dare")
            while _served_version(client) != version:  # the server switches by itself
                time.sleep(0.1)
            timings["switch_s"] = time.perf_counter() - start
            rows.append({"day": day, "items": spec.num_items - 2, "train_examples": spec.counts["train"],
                         "steps": results["per_seed"][0]["steps"], "continued": previous is not None,
                         "test_auc": round(results["test"]["auc"], 4), "served_version": version,
                         **{k: round(v, 1) for k, v in timings.items()}})
            if on_day is not None:
                on_day(data_dir, rows[-1])
            print(rows[-1], flush=True)
            previous = run
    finally:
        if server is not None:
            server.stop(0)
    return rows


if __name__ == "__main__":
    main(*[int(a) if i == 0 else a for i, a in enumerate(sys.argv[1:3])])
