"""The training step's cost as behaviour fields widen the embeddings
(`ModelConfig.fields`): DARE and TWIN at the reference configuration (L=200,
K=20, d=16, 50k items, 1k categories) with 0, 1, 2 and 4 extra fields of
1,000 ids and width 16 each (DARE: attention width 16 too), the last of them
history-only when there are several. Samples/s of Keras's train step (forward,
backward, Adam) and of prediction on in-memory batches, measured in process in
the same run, and each configuration's ratio to the same preset without fields.

Usage: python benchmarks/bench_fields.py [--batch 256] [--seconds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import print_table, time_call, write_parts  # noqa: E402

ITEMS, CATEGORIES, LENGTH, FIELD_IDS, WIDTH = 50_000, 1_000, 200, 1_000, 16


def fields(count: int) -> list[dict]:
    return [dict(name=f"field{i}", vocabulary=FIELD_IDS, embedding_dim=WIDTH, attention_embedding_dim=WIDTH,
                 history_only=count > 1 and i == count - 1) for i in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import keras
    import numpy as np

    import dare_tf

    rng = np.random.default_rng(0)
    b = args.batch
    rows = []
    for preset in ("dare", "twin"):
        base = None
        for count in (0, 1, 2, 4):
            model = dare_tf.build_model(preset, ITEMS, CATEGORIES, max_len=LENGTH, top_k=20, seed=0,
                                        fields=fields(count), sparse_embedding_gradients=False)
            x = {"target_item": rng.integers(1, ITEMS, b), "target_category": rng.integers(1, CATEGORIES, b),
                 "hist_items": rng.integers(1, ITEMS, (b, LENGTH)),
                 "hist_categories": rng.integers(1, CATEGORIES, (b, LENGTH))}
            for f in model.model_config.fields:
                x[f"hist_{f.name}"] = rng.integers(1, FIELD_IDS, (b, LENGTH))
                if not f.history_only:
                    x[f"target_{f.name}"] = rng.integers(1, FIELD_IDS, b)
            x = {k: v.astype("int32") for k, v in x.items()}
            y = rng.integers(0, 2, b).astype("float32")
            if keras.backend.backend() == "tensorflow":
                from dare_tf.optimizers import FusedAdam

                optimizer = FusedAdam(0.01)
            else:
                optimizer = keras.optimizers.Adam(0.01)
            model.compile(optimizer=optimizer)
            cfg = model.model_config
            row = {"preset": preset, "fields": count, "attention_width": cfg.attention_width,
                   "representation_width": cfg.representation_width, "batch": b,
                   "train_samples_per_s": b / time_call(lambda: model.train_on_batch(x, y), args.seconds),
                   "predict_samples_per_s": b / time_call(lambda: model.predict_on_batch(x), args.seconds)}
            base = base or row
            row["train/no_fields"] = row["train_samples_per_s"] / base["train_samples_per_s"]
            row["predict/no_fields"] = row["predict_samples_per_s"] / base["predict_samples_per_s"]
            rows.append(row)
            print(f"  {row}", flush=True)
    print_table(rows, list(rows[0]))
    write_parts("bench_fields", {"step": rows}, ["step"], args.json)


if __name__ == "__main__":
    main()
