r"""The trainer on JAX against `model.fit` on in-memory batches, on whatever
accelerator JAX finds (a GPU where one is lent; the CPU otherwise), with no
TensorFlow: one program, one call of the device tool (docs/gpu.md).

  make gpu-carry     # here: .whl/, the wheels the GPU machine lacks (Keras, tensorboard, ...)
  pip install --no-deps .whl/*.whl && KERAS_BACKEND=jax python benchmarks/bench_gpu.py  # there
  KERAS_BACKEND=jax python benchmarks/bench_gpu.py --quick    # a small check on a CPU

1. a Taobao-like log at `--fraction` of its real size (`data.synthetic
   --like=taobao`), prepared (`data.prepare`), both on this machine;
2. for each batch size and model (DARE, TWIN; d=16, L=200):
   - the harness (`--harness_steps`, 0: none): the same model's `model.fit` on
     in-memory numpy batches (features assembled beforehand), timed on its second
     `fit` (the first compiles);
   - the trainer's whole epoch (`--epoch_models`): a `JaxSeedRun` of one epoch of
     the prepared split (its input, BatchNorm refresh, validation, checkpoint, test
     predictions and the saved model included; its compile times reported apart),
     run twice: the second time its compiled functions come from JAX's persistent
     compilation cache;
   - the steps taken: `dare_tf.training.jax_loop`'s jitted training function
     (windows gathered on the device, `--steps_per_execution` steps a call) under
     each table-gradient mode of `--gradients` (`dare_tf.layers.table_gradients`),
     each against the one before it, with XLA's count of the bytes one training step
     accesses (`cost_analysis`), whose time at the card's memory bandwidth is the
     step's bound; the row reports the fastest;
   with the process's peak device memory so far;
3. the epoch projected to the full Taobao-like split (5.1M training examples);
4. one call of the fastest mode's steps under `jax.profiler` (its Perfetto trace): the
   ten largest kernels (a GPU's streams; on a CPU, the host's XLA events) by share of
   the step's time, with their time and count per step.

Writes benchmarks/results/bench_gpu.json (or `--out`) after every row, so a run
cut short keeps what it measured; `--budget_s` stops before a row would start
past it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("KERAS_BACKEND", "jax")

from benchmarks.common import print_table, write_json  # noqa: E402

FULL_TRAIN_EXAMPLES = 5_100_000  # the paper's Taobao training split
# Memory bandwidth by device kind (bytes/s): the bound of a step that moves B bytes is B / this.
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def device_info() -> dict:
    import jax

    device = jax.devices()[0]
    kind = getattr(device, "device_kind", device.platform)
    bandwidth = next((b for name, b in BANDWIDTH.items() if name in kind), None)
    return {"platform": device.platform, "kind": kind, "devices": jax.device_count(), "bandwidth": bandwidth}


def peak_memory() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def prepare(work: str, fraction: float) -> tuple[str, dict]:
    log, data = os.path.join(work, "taobao_like.csv"), os.path.join(work, "prepared")
    times = {}
    for name, args in (("generate", ["data.synthetic", "--like=taobao", f"--fraction={fraction}", f"--output={log}"]),
                       ("prepare", ["data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={data}"])):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", *args], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        times[f"{name}_s"] = time.perf_counter() - started
    return data, times


def config_for(model: str, batch: int, steps_per_execution: int, epochs: int = 1):
    from dare_tf.training.config import TrainConfig

    return TrainConfig.create(preset=model, batch_size=batch, epochs=epochs, seeds=(0,), verbose=0,
                              steps_per_execution=steps_per_execution, eval_batch_size=8192,
                              model_overrides={"max_len": 200})


def harness(model_config, split, batch: int, steps: int) -> float:
    """`model.fit` examples/s on `steps` in-memory batches (its second fit)."""
    import keras
    import numpy as np

    from dare_tf.models import DareModel
    from dare_tf.tasks import ClickTask

    n = min(len(split), batch * steps) // batch * batch
    rows = np.arange(n)
    x = split.features_of({k: v[rows] for k, v in split.columns.items()})
    x = {k: np.asarray(v, np.int32) for k, v in x.items() if k in ("target_item", "target_category", "hist_items",
                                                                     "hist_categories", "uid")}
    y = split.labels[rows]
    keras.utils.set_random_seed(0)
    model = DareModel(model_config, seed=0)
    model.task = ClickTask()
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, steps_per_epoch=min(3, n // batch))
    started = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return n / (time.perf_counter() - started)


def trainer(data_dir: str, spec, memory, model: str, batch: int, k: int, chunks: int, work: str,
            dump_dir: str | None = None, epoch: bool = True, modes: tuple = ("sorted",)) -> dict:
    """The trainer's whole epoch (where `epoch`: run twice, the second time with its
    compiled functions read from JAX's persistent cache; the platform's default
    table-gradient mode), then its step rate and XLA's bytes per step under each
    table-gradient mode of `modes` (`dare_tf.layers.table_gradients`), each measured
    against the one before it in this process, and the fastest one's profile."""
    import jax
    import numpy as np

    from dare_tf.layers.table_gradients import table_gradient_mode
    from dare_tf.training.config import effective_model_config
    from dare_tf.training.jax_distribution import Placement
    from dare_tf.training.jax_loop import JaxSeedRun

    config = config_for(model, batch, k)
    model_config = effective_model_config(config, spec, None)
    result = {}
    for attempt in ("", "_cached")[: 2 if epoch else 0]:
        run_dir = tempfile.mkdtemp(dir=work)
        run = JaxSeedRun(data_dir, run_dir, config, 0, spec, model_config, memory, Placement(), True, lambda s: None)
        started = time.perf_counter()
        run.run()
        epoch_s = time.perf_counter() - started
        history = [json.loads(line) for line in open(os.path.join(run_dir, "history.jsonl"))]
        compile_s = sum(run.functions.compile_seconds.values())
        per_epoch = memory["train"].per_epoch
        result.update({f"epoch_s{attempt}": epoch_s, f"compile_s{attempt}": compile_s,
                       f"epoch_examples_per_s{attempt}": per_epoch / epoch_s,
                       f"train_seconds{attempt}": history[-1]["timing"]["train_seconds"],
                       f"validation_s{attempt}": sum(h["timing"]["val_seconds"] + h["timing"]["bn_seconds"]
                                                     for h in history)})
        result["validations"] = len(history)
    if not epoch:
        run = JaxSeedRun(data_dir, tempfile.mkdtemp(dir=work), config, 0, spec, model_config, memory, Placement(),
                         True, lambda s: None)
    functions = run.functions
    functions.load()
    order = run.training_order(0)
    chunks = min(chunks, len(order) // k - 1)
    order = order[: k * (chunks + 1)].reshape(chunks + 1, k, batch)
    steps = []
    for mode in modes:
        functions._jitted.pop(f"train/{k}", None)  # traced again, under `mode`
        with table_gradient_mode(mode):
            started = time.perf_counter()
            jax.block_until_ready(functions.train(order[0]))
            compiled_s = time.perf_counter() - started
            started = time.perf_counter()
            for rows in order[1:]:
                losses = functions.train(rows)
            jax.block_until_ready(losses)
            rate = chunks * k * batch / (time.perf_counter() - started)
            jitted = functions._jitted[f"train/{k}"]
            cost = jitted.lower(functions.state, functions.train_split.arrays, np.asarray(order[0], np.int32)).compile()
            analysis = cost.cost_analysis()
            analysis = analysis[0] if isinstance(analysis, list) else analysis
            steps.append({"gradients": mode, "examples_per_s": rate, "first_call_s": compiled_s,
                          "step_bytes": float(analysis.get("bytes accessed", 0.0)) / k,
                          "step_flops": float(analysis.get("flops", 0.0)) / k})
            print(json.dumps(dict(steps[-1], model=model, batch=batch)), flush=True)
    # The profile and the HLO of the fastest mode's step (traced again: its compiled
    # function read from the persistent cache).
    best = max(steps, key=lambda step: step["examples_per_s"])
    functions._jitted.pop(f"train/{k}", None)
    with table_gradient_mode(best["gradients"]):
        jax.block_until_ready(functions.train(order[0]))
        if dump_dir and batch == 2048:  # the optimized HLO, read offline (which fusions, which kernels)
            import gzip

            jitted = functions._jitted[f"train/{k}"]
            with gzip.open(os.path.join(dump_dir, f"hlo_{model}_{batch}.txt.gz"), "wt") as f:
                f.write(jitted.lower(functions.state, functions.train_split.arrays,
                                     np.asarray(order[0], np.int32)).compile().as_text())
        profile = step_profile(functions, order[1], k, os.path.join(work, f"profile_{model}_{batch}"), dump_dir)
    run.predict("val")
    started = time.perf_counter()
    run.predict("val")
    predict_rate = run.splits["val"].count / (time.perf_counter() - started)
    return {**result, "predict_examples_per_s": predict_rate, "trainer_steps_examples_per_s": best["examples_per_s"],
            "gradients": best["gradients"], "step_bytes": best["step_bytes"], "step_flops": best["step_flops"],
            "steps": steps, "profile": profile}


def step_profile(functions, rows, k: int, trace_dir: str, dump_dir: str | None = None, top: int = 10) -> list[dict]:
    """Where a training step's time goes: one call of `k` steps under `jax.profiler`
    (its Perfetto trace), the device's (or, on a CPU, the host's XLA) events grouped by
    name: the `top` largest by total time, each with its share of the events' time and
    its count per step."""
    import glob
    import gzip

    import jax

    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        jax.block_until_ready(functions.train(rows))
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        return []
    if dump_dir:  # the trace itself, for Perfetto's UI
        import shutil

        shutil.copy(paths[0], os.path.join(dump_dir, f"trace_{os.path.basename(trace_dir)}.json.gz"))
    with gzip.open(paths[0], "rt") as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    threads = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    timed = [e for e in events if e.get("ph") == "X" and e.get("dur")]
    # Kernels where a device ran them (GPU streams); else the host's XLA thunks (CPU).
    device = [e for e in timed if "stream" in threads.get((e.get("pid"), e.get("tid")), "").lower()]
    timed = device or [e for e in timed  # (less the wrappers around the kernels)
                       if not e.get("name", "").startswith(("$", "PjitFunction", "jit_", "ThunkExecutor"))]
    totals: dict[str, list] = {}
    for e in timed:
        entry = totals.setdefault(e["name"], [0.0, 0])
        entry[0] += e["dur"]
        entry[1] += 1
    whole = sum(t for t, _ in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name[:80], "share": t / whole, "us_per_step": t / k, "count_per_step": n / k}
            for name, (t, n) in ranked]


def summarize(payload: dict) -> dict:
    """The rows' steps (each gradient mode) and profiles as the payload's own lists
    `steps` and `profile`, each entry with its model and batch (docs/gpu.md's tables)."""
    for part in ("steps", "profile"):
        payload[part] = [dict(entry, model=r["model"], batch=r["batch"], **({"gradients": r["gradients"]}
                                                                          if part == "profile" and "gradients" in r
                                                                          else {}))
                         for r in payload["rows"] for entry in r.get(part, [])]
    return payload


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--batches", default="256,2048,8192")
    parser.add_argument("--models", default="dare,twin")
    parser.add_argument("--steps_per_execution", type=int, default=50)
    parser.add_argument("--harness_steps", type=int, default=100, help="0: no harness")
    parser.add_argument("--gradients", default="xla,materialized,privatized", help="the table-gradient modes "
                        "measured one after another (dare_tf.layers.table_gradients.MODES); the row reports the "
                        "fastest")
    parser.add_argument("--epoch_models", default="dare,twin", help="the models whose whole epoch is run (twice: "
                        "cold, then with the compiled functions from JAX's persistent cache)")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--budget_s", type=float, default=480)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--dump_dir", default=None, help="where each row's Perfetto trace (and, at batch 2048, the "
                        "training function's optimized HLO) are copied")
    parser.add_argument("--merge", default=None, help="an earlier run's JSON: its rows of the (model, batch) pairs "
                        "not measured now are kept, each with its own device and time")
    parser.add_argument("--quick", action="store_true", help="a small check: fraction 0.005, batches 256")
    args = parser.parse_args()
    if args.quick:
        args.fraction, args.batches, args.harness_steps, args.chunks, args.steps_per_execution = 0.005, "256", 4, 2, 4
    began = time.perf_counter()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_gpu-")
    os.makedirs(work, exist_ok=True)
    import jax

    from dare_tf.training.jax_loop import use_compilation_cache

    use_compilation_cache(os.path.join(work, "jax_cache"))  # (the trainer's cache, in the run's own folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    data_dir, prep = prepare(work, args.fraction)
    from dare_tf.data.feeding.memory import InMemorySplit
    from dare_tf.data.storage.spec import DatasetSpec
    from dare_tf.training.config import effective_model_config

    spec = DatasetSpec.load(data_dir)
    memory = {s: InMemorySplit.load(data_dir, s, spec, 200) for s in ("train", "val", "test")}
    info = device_info()
    payload = {"device": info, "fraction": args.fraction, "train_examples": memory["train"].per_epoch,
               "steps_per_execution": args.steps_per_execution, "preparation": prep, "rows": [],
               "tensorflow_loaded": "tensorflow" in sys.modules}
    print(f"{info['kind']} x{info['devices']}: {memory['train'].per_epoch} training examples "
          f"(fraction {args.fraction}), prepared in {prep}", flush=True)
    for batch in map(int, args.batches.split(",")):
        for model in args.models.split(","):
            if time.perf_counter() - began > args.budget_s:
                payload["cut_short"] = f"stopped before {model} at batch {batch}: past --budget_s={args.budget_s}"
                break
            model_config = effective_model_config(config_for(model, batch, args.steps_per_execution), spec, None)
            row = {"model": model, "batch": batch}
            if args.harness_steps:
                row["harness_examples_per_s"] = harness(model_config, memory["train"], batch, args.harness_steps)
            row.update(trainer(data_dir, spec, memory, model, batch, args.steps_per_execution, args.chunks, work,
                               args.dump_dir, model in args.epoch_models.split(","),
                               tuple(args.gradients.split(","))))
            if args.harness_steps:
                row["share_of_harness"] = row["trainer_steps_examples_per_s"] / row["harness_examples_per_s"]
            for measured in [row, *row["steps"]]:
                rate = measured.get("trainer_steps_examples_per_s", measured.get("examples_per_s"))
                if info["bandwidth"]:
                    measured["bound_examples_per_s"] = batch * info["bandwidth"] / max(measured["step_bytes"], 1.0)
                    measured["measured_over_bound"] = rate / measured["bound_examples_per_s"]
            for before, after in zip(row["steps"], row["steps"][1:]):
                after["over_previous"] = after["examples_per_s"] / before["examples_per_s"]
            row["full_epoch_projected_s"] = FULL_TRAIN_EXAMPLES / row["trainer_steps_examples_per_s"]
            row["peak_memory_bytes"] = peak_memory()
            row["elapsed_s"] = time.perf_counter() - began
            row["measured"] = f"{info['kind']}, {time.strftime('%Y-%m-%dT%H:%M:%S')}"
            payload["rows"].append(row)
            print(json.dumps(row), flush=True)
            write_json("bench_gpu", payload, args.out)
    payload["tensorflow_loaded"] = "tensorflow" in sys.modules
    if args.merge:
        with open(args.merge) as f:
            earlier = json.load(f)
        now = {(r["model"], r["batch"]) for r in payload["rows"]}
        kept = [dict(r, measured=r.get("measured", f"{earlier['device']['kind']}, {earlier.get('written')}"))
                for r in earlier["rows"] if (r["model"], r["batch"]) not in now]
        payload["rows"] = sorted(kept + payload["rows"], key=lambda r: (r["batch"], r["model"]))
    print_table(payload["rows"], ["model", "batch", "harness_examples_per_s", "trainer_steps_examples_per_s",
                                  "share_of_harness", "epoch_s", "compile_s", "epoch_s_cached", "compile_s_cached",
                                  "train_seconds_cached", "full_epoch_projected_s", "peak_memory_bytes"])
    summarize(payload)
    if payload["steps"]:  # the table of the steps taken: each gradient mode against the one before it
        print_table(payload["steps"], ["model", "batch", "gradients", "examples_per_s", "over_previous", "step_bytes",
                                       "measured_over_bound"])
    if payload["profile"]:  # (where a step's time goes, its ten largest events per row)
        print_table(payload["profile"], ["model", "batch", "name", "share", "us_per_step", "count_per_step"])
    write_json("bench_gpu", payload, args.out)


if __name__ == "__main__":
    main()
