r"""Where a step's history windows are best assembled: on the host in numpy (one
thread or several), or on the device as a gather inside the jitted function
(`dare_tf.training.engines.jax.device_input`), each against the bound of the bytes it moves.

  KERAS_BACKEND=jax python benchmarks/bench_windows.py [--batch=2048] [--max_len=200] [--seconds=3]

A store of `--clicks` clicks (items and categories, random users of 500 clicks)
and `--batch`-example batches at L=`--max_len`:

- `host numpy, N threads`: `InMemorySplit.host_batches`, batches assembled by N
  threads at once (numpy's gathers hold the GIL for part of their work);
- `device gather (jit)`: `DeviceSplit.assemble` jitted, on JAX's first device (here
  the CPU; on a GPU the trainer's steps include it: bench_gpu.py).

The bound: every window slot reads one store row (`F` int32 ids, within one 64-byte
cache line, as a random gather touches a whole line) and writes its `F` ids to the
batch; at the memory bandwidth a large `np.copyto` reaches (read + write bytes over
its time), that is `bandwidth / (L * (64 + 4 F))` examples/s. Writes
results/bench_windows.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("KERAS_BACKEND", "jax")

from benchmarks.common import print_table, write_json  # noqa: E402

CACHE_LINE = 64


def copy_bandwidth(nbytes: int = 1 << 28) -> float:
    """Bytes/s read plus written by `np.copyto` of a large array (the best of 3)."""
    a, b = np.ones(nbytes // 8), np.empty(nbytes // 8)
    best = np.inf
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - started)
    return 2 * nbytes / best


def split_of(clicks: int, examples: int, max_len: int, seed: int = 0):
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.store import SequenceStore

    rng = np.random.default_rng(seed)
    length = 500
    users = clicks // length
    store = SequenceStore(rng.integers(1, 1_000_000, users * length).astype(np.int32),
                          rng.integers(1, 5_000, users * length).astype(np.int32),
                          np.arange(users, dtype=np.int64) * length, np.full(users, length, np.int32))
    columns = {"uid": rng.integers(0, users, examples).astype(np.int32),
               "position": rng.integers(0, length, examples).astype(np.int32),
               "target_item": rng.integers(1, 1_000_000, examples).astype(np.int32),
               "target_category": rng.integers(1, 5_000, examples).astype(np.int32),
               "label": rng.integers(0, 2, examples).astype(np.int32)}
    return InMemorySplit(columns, store, max_len)


def rate(fn, batch: int, seconds: float) -> float:
    fn()  # (warm: compiles, caches)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += fn()
    return done * batch / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--max_len", type=int, default=200)
    parser.add_argument("--clicks", type=int, default=20_000_000)
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    batch, max_len = args.batch, args.max_len
    split = split_of(args.clicks, 64 * batch, max_len)
    orders = split.epoch_order(0, 0).reshape(-1, batch)
    features = len(split.store.click_rows()[0])
    bandwidth = copy_bandwidth()
    bound = bandwidth / (max_len * (CACHE_LINE + 4 * features))
    rows = []
    for threads in map(int, args.threads.split(",")):
        pool = ThreadPoolExecutor(threads)

        def host(pool=pool, threads=threads):
            list(pool.map(lambda rows: next(split.host_batches(rows, batch)), orders[:threads * 4]))
            return threads * 4
        rows.append({"method": f"host numpy, {threads} threads", "examples_per_s": rate(host, batch, args.seconds)})
        pool.shutdown()
    import jax

    from dare_tf.training.engines.jax.device_input import DeviceSplit

    device = DeviceSplit(split)
    assemble = jax.jit(device.assemble)
    on_device = [jax.device_put(o.astype(np.int32)) for o in orders[:8]]

    def gather():
        jax.block_until_ready([assemble(device.arrays, o) for o in on_device])
        return len(on_device)
    rows.append({"method": f"device gather (jit, {jax.devices()[0].platform})",
                 "examples_per_s": rate(gather, batch, args.seconds)})
    for row in rows:
        row.update(bound_examples_per_s=bound, measured_over_bound=row["examples_per_s"] / bound)
    print_table(rows, ["method", "examples_per_s", "bound_examples_per_s", "measured_over_bound"])
    write_json("bench_windows", {"batch": batch, "max_len": max_len, "clicks": args.clicks,
                                 "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
