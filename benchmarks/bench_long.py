"""Serving long histories: request size and in-process latency of the ranker
export at history lengths 1,000 and 10,000.

Usage: python benchmarks/bench_long.py [--lengths 1000,10000] [--json PATH]

Prepares a small lifelong synthetic log (vocabularies and id maps for the
export), builds DARE (K=20, d=16, `aux_attention=retrieved`, untrained:
latency does not depend on the weights) at L = each length, exports it
(`dare_tf.export`), loads the SavedModel in this process
(`LocalModel`) and times `serving_default` for one target and for 200
candidates of one user, with the history sent once (`[1, T]`, shared) and
repeated per candidate (`[200, T]`). The request size is the serialized
`PredictRequest` (what gRPC carries). The training side of long histories
is `bench_train.py --parts long`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from benchmarks.common import print_table, time_call, write_parts  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1000,10000")
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    import dare_tf
    from dare_tf.data.protocol import Protocol, prepare
    from dare_tf.data.spec import DatasetSpec, read_id_map
    from dare_tf.data.synthetic import SyntheticConfig, write
    from dare_tf.serving.cascade import LocalModel
    from dare_tf.export import export_saved_model

    work = tempfile.mkdtemp(prefix="bench_long_")
    log = os.path.join(work, "log.csv")
    write(SyntheticConfig(users=60, items=20_000, categories=200, min_length=1000, max_length=1000,
                          length_median=1000, length_sigma=0.0, seed=0), log)
    data_dir = os.path.join(work, "data")
    prepare("taobao", log, data_dir, Protocol(min_clicks=200))
    spec = DatasetSpec.load(data_dir)
    raw_items = np.array(read_id_map(data_dir, "item"), np.int64)
    raw_categories = np.array(read_id_map(data_dir, "category"), np.int64)
    rng = np.random.default_rng(0)
    rows = []
    for length in [int(v) for v in args.lengths.split(",")]:
        model = dare_tf.build_model("dare", spec.num_items, spec.num_categories, max_len=length,
                                    num_positions=length + 1, aux_attention="retrieved", seed=0)
        model.build()
        path = export_saved_model(model, data_dir, os.path.join(work, "exports"), f"dare_{length}")
        served = LocalModel(path)
        history = rng.integers(0, len(raw_items), length)
        hist_items, hist_categories = raw_items[history][None], raw_categories[history % len(raw_categories)][None]
        for batch, shared in ((1, True), (args.candidates, True), (args.candidates, False)):
            targets = rng.integers(0, len(raw_items), batch)
            inputs = {"target_item": raw_items[targets], "target_category": raw_categories[targets % len(raw_categories)],
                      "hist_items": hist_items if shared else np.repeat(hist_items, batch, 0),
                      "hist_categories": hist_categories if shared else np.repeat(hist_categories, batch, 0)}
            request = predict_pb2.PredictRequest()
            for name, value in inputs.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            seconds = time_call(lambda: served.predict_tensors(inputs), min_seconds=3.0)
            rows.append({"L": length, "targets": batch, "history": "shared [1, T]" if shared else f"repeated [{batch}, T]",
                         "request_kb": request.ByteSize() / 1024, "p50_ms": 1000 * seconds,
                         "examples_per_s": batch / seconds})
            print(f"  {rows[-1]}", flush=True)
    print(f"serving long histories (in-process SavedModel, DARE K=20 d=16, {os.cpu_count()} CPUs)")
    print_table(rows, ["L", "targets", "history", "request_kb", "p50_ms", "examples_per_s"])
    write_parts("bench_long", {"serving": rows}, ["serving"], args.json)


if __name__ == "__main__":
    main()
