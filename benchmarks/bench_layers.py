"""Speed of the layers and presets: forward+backward samples/s and the search stage alone.

Usage: python benchmarks/bench_layers.py [--quick] [--parts presets,search,models] [--json PATH]

Part 1: every preset at L=200, K=20, d=16, batch 256 and 2048, XLA on and off.
Part 2: the search stage alone (attention-table lookup, scores, top-K) for
attention dims 64/32/16 per field and L = 200, 1,000, 10,000; it prints the
64 -> 32 speed-up and the growth of time per behaviour from L=200 to 10,000.
Part 3: stage 1 of each model (`dare_tf.analysis.dimensions.search_stage`:
TWIN's and DARE's top-K by dot product, ETA's SimHash Hamming top-K,
TWIN-V2's clustering and search over clusters, SDIM's bucket matching) at
L = 200, 1,000, 10,000, batch 128, XLA, all models timed in turn per round:
time per behaviour.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from dare_tf._startup import import_tensorflow_quietly  # noqa: E402

import_tensorflow_quietly()  # (TensorFlow's start-up notices filtered, as in the programs)
import tensorflow as tf  # noqa: E402

import dare_tf  # noqa: E402
from benchmarks.common import print_table, selected_parts, time_call, write_json  # noqa: E402
from dare_tf.layers import BehaviorEmbedding  # noqa: E402
from dare_tf.search import SoftTopKSearch  # noqa: E402

NUM_ITEMS, NUM_CATEGORIES = 50_000, 1_000


def random_inputs(rng, batch, length):
    return {
        "target_item": tf.constant(rng.integers(1, NUM_ITEMS, batch), tf.int32),
        "target_category": tf.constant(rng.integers(1, NUM_CATEGORIES, batch), tf.int32),
        "hist_items": tf.constant(rng.integers(1, NUM_ITEMS, (batch, length)), tf.int32),
        "hist_categories": tf.constant(rng.integers(1, NUM_CATEGORIES, (batch, length)), tf.int32),
    }


def bench_presets(rng, batches, min_seconds):
    """Forward+backward samples/s of every preset: `graph` runs the whole step as one
    TensorFlow graph; `xla` lets the model compile its dense stages with XLA
    (`jit_compile_dense=True`, as the trainer does) inside that graph. (Wrapping the
    step in an outer XLA function as well took 8.5 s a step: XLA folds the captured
    tables as constants.)"""
    rows = []
    for preset in sorted(dare_tf.PRESETS):
        labels = {b: tf.constant(rng.integers(0, 2, b), tf.float32) for b in batches}
        for batch in batches:
            x = random_inputs(rng, batch, 200)
            row = {"preset": preset, "batch": batch}
            for jit in (False, True):
                model = dare_tf.build_model(preset, NUM_ITEMS, NUM_CATEGORIES, max_len=200, top_k=20,
                                            embedding_dim=16, seed=0, jit_compile_dense=jit)

                @tf.function
                def step(inputs, y, model=model):
                    with tf.GradientTape() as tape:
                        loss = model.loss_terms(y, model.forward(inputs, training=True))["total"]
                    return tape.gradient(loss, model.trainable_variables)

                seconds = time_call(lambda: step(x, labels[batch]), min_seconds)
                row["xla" if jit else "graph"] = batch / seconds
            row["xla/graph"] = row["xla"] / row["graph"]
            rows.append(row)
            print(f"  {preset} batch={batch}: graph {row['graph']:.0f}/s, xla {row['xla']:.0f}/s", flush=True)
    return rows


def bench_search(rng, dims, lengths, batch, min_seconds, rounds=3):
    """ms per search call for each attention dim. The dims are timed in turn, `rounds`
    times, and each keeps its median, so a slow spell of the machine hits all of them."""
    searches = {}
    for dim in dims:
        # One attention width per field (item, category, position), so halving
        # the attention dim halves every vector the search reads.
        searches[dim] = (BehaviorEmbedding(NUM_ITEMS, NUM_CATEGORIES, embedding_dim=dim, position_dim=dim,
                                           num_positions=max(lengths) + 1, coupling="shared"),
                         SoftTopKSearch(20, position_dim=dim))
    rows = []
    for length in lengths:
        x = random_inputs(rng, batch, length)
        for jit in (False, True):
            runs = {}
            for dim, (emb, search) in searches.items():
                def run(inputs, emb=emb, search=search):
                    e = emb(inputs["target_item"], inputs["target_category"],
                            inputs["hist_items"], inputs["hist_categories"])
                    found = search(e["target_attention"], e["history_attention"], None, inputs["hist_items"] > 0)
                    return found["positions"]

                runs[dim] = tf.function(run, jit_compile=jit)
            times = {dim: [] for dim in dims}
            for _ in range(rounds):
                for dim in dims:
                    times[dim].append(time_call(lambda: runs[dim](x), min_seconds))
            for dim in dims:
                seconds = float(np.median(times[dim]))
                rows.append({"attention_dim": dim, "L": length, "xla": jit, "batch": batch,
                             "ms": seconds * 1e3, "ns_per_behaviour": seconds / (batch * length) * 1e9})
                print(f"  dim={dim} L={length} xla={jit}: {seconds * 1e3:.2f} ms "
                      f"(rounds: {', '.join(f'{t * 1e3:.2f}' for t in times[dim])})", flush=True)
    return rows


# Stage-1 variants compared in part 3: (label, preset, overrides).
SEARCH_MODELS = [("twin", "twin", {}), ("dare (attention 8)", "dare", dict(attention_embedding_dim=8,
                                                                        attention_position_dim=8)),
                 ("eta (32 bits)", "eta", {}), ("twin_v2 (window 16)", "twin_v2", {}),
                 ("sdim (8 x 3 bits)", "sdim", {})]


def bench_model_search(rng, lengths, batch, rounds=3):
    from dare_tf.analysis.dimensions import search_stage

    rows = []
    for length in lengths:
        x = random_inputs(rng, batch, length)
        stages = {}
        for label, preset, overrides in SEARCH_MODELS:
            model = dare_tf.build_model(preset, NUM_ITEMS, NUM_CATEGORIES, max_len=length, top_k=20, seed=0,
                                        num_positions=length + 1, **overrides)
            stage = search_stage(model)
            stages[label] = lambda x, stage=stage: stage(x)
            if preset == "eta":  # signatures of the histories computed once, outside the timed call
                keys = model.embeddings(x).roles["history_attention"]
                signatures = model.search.signatures(keys)
                stages[f"{label}, signatures given"] = lambda x, stage=stage, s=signatures: stage(x, s)
        for fn in stages.values():
            np.asarray(fn(x))  # compile
        times = {label: [] for label in stages}
        for _ in range(rounds):
            for label, fn in stages.items():
                times[label].append(time_call(lambda: np.asarray(fn(x)), 0.3))
        for label in stages:
            seconds = float(np.median(times[label]))
            rows.append({"model": label, "L": length, "ms": seconds * 1e3,
                         "ns_per_behaviour": seconds / (batch * length) * 1e9})
        twin = next(r["ns_per_behaviour"] for r in rows if r["model"] == "twin" and r["L"] == length)
        for r in rows:
            if r["L"] == length:
                r["vs_twin"] = r["ns_per_behaviour"] / twin
        print(f"  L={length}: " + ", ".join(f"{r['model']} {r['ms']:.2f} ms" for r in rows if r["L"] == length),
              flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter measurements")
    parser.add_argument("--parts", default="presets,search,models",
                        help="comma-separated parts to run: presets (part 1), search (part 2), models (part 3)")
    parser.add_argument("--json", default=None, help="output JSON path")
    args = parser.parse_args()
    parts = selected_parts(parser, args.parts, ("presets", "search", "models"))
    rng = np.random.default_rng(0)
    min_seconds = 0.5 if args.quick else 2.0
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs")
    payload = {}
    if "presets" in parts:
        print("Part 1: forward+backward samples/s (L=200, K=20, d=16, vocab 50k items)")
        payload["presets"] = bench_presets(rng, [256] if args.quick else [256, 2048], min_seconds)
        print_table(payload["presets"], ["preset", "batch", "graph", "xla", "xla/graph"])
    if "search" in parts:
        payload.update(search_part(rng, args))
    if "models" in parts:
        print("Part 3: stage 1 of each model, batch 128, XLA (ns per behaviour)")
        payload["models"] = bench_model_search(rng, [200, 1_000] if args.quick else [200, 1_000, 10_000], 128,
                                               rounds=1 if args.quick else 3)
        print_table(payload["models"], ["model", "L", "ms", "ns_per_behaviour", "vs_twin"])
    write_json("bench_layers", payload, args.json)


def search_part(rng, args) -> dict:
    print("Part 2: search stage alone (lookup + scores + top-20), batch 128")
    lengths = [200, 1_000] if args.quick else [200, 1_000, 10_000]
    search = bench_search(rng, [64, 32, 16], lengths, 128, 0.25 if args.quick else 1.0,
                          rounds=1 if args.quick else 3)
    search.sort(key=lambda r: (-r["attention_dim"], r["L"], r["xla"]))
    print_table(search, ["attention_dim", "L", "xla", "ms", "ns_per_behaviour"])

    summary = []
    for jit in (False, True):
        ms = {(r["attention_dim"], r["L"]): r for r in search if r["xla"] == jit}
        for length in lengths:
            summary.append({"xla": jit, "L": length, "metric": "speed-up 64->32",
                            "value": ms[(64, length)]["ms"] / ms[(32, length)]["ms"], "target": ">= 1.7"})
        for dim in (64, 32, 16):
            summary.append({"xla": jit, "L": f"{lengths[0]}->{lengths[-1]}", "metric": f"ns/behaviour growth d={dim}",
                            "value": ms[(dim, lengths[-1])]["ns_per_behaviour"]
                            / ms[(dim, lengths[0])]["ns_per_behaviour"],
                            "target": "<= 1.2"})
    print("Targets")
    print_table(summary, ["xla", "L", "metric", "value", "target"])
    return {"search": search, "summary": summary}


if __name__ == "__main__":
    main()
