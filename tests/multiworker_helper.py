"""Test helper: trains one seed with a strategy, then saves that process's final
weights (WEIGHTS_OUT.npz) and what it read and computed (WEIGHTS_OUT.json: steps,
test metrics, its partitions' train users, the clicks of the store it loaded).

Usage: python tests/multiworker_helper.py STRATEGIES DATA_DIR OUTPUT_DIR WEIGHTS_OUT
           [MAX_STEPS [OPTIMIZERS [IN_MEMORY_MB]]]
(the caller sets TF_CONFIG for multi_worker). STRATEGIES, OPTIMIZERS and
IN_MEMORY_MB: one value, or several comma-separated, each combination trained
in turn in this process (one process start for all) in OUTPUT_DIR/S/O/M and
WEIGHTS_OUT with `.npz` replaced by `.S.O.M.npz`, naming only the settings
given several values.
"""

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from dare_tf import training  # noqa: E402
from dare_tf.data.storage import store  # noqa: E402
from dare_tf.data.storage.spec import DatasetSpec  # noqa: E402


def main(strategy_names, data_dir, output_dir, weights_out, max_steps="6", optimizers="adam", in_memory_mb="4096"):
    strategies, names, sizes = strategy_names.split(","), optimizers.split(","), in_memory_mb.split(",")
    # Logical devices are set once, before TensorFlow runs anything.
    made = {name: training.make_strategy(name, cpu_devices=2 if "mirrored" in strategies and i == 0 else 0)
            for i, name in enumerate(strategies)}
    for strategy_name, optimizer, size in itertools.product(strategies, names, sizes):
        parts = [v for v, many in ((strategy_name, len(strategies) > 1), (optimizer, len(names) > 1),
                                   (size, len(sizes) > 1)) if many]
        train_one(made[strategy_name], strategy_name, data_dir, os.path.join(output_dir, *parts),
                  weights_out.replace(".npz", "".join(f".{p}" for p in parts) + ".npz"), max_steps, optimizer, size)


def train_one(strategy, strategy_name, data_dir, output_dir, weights_out, max_steps, optimizer, in_memory_mb):
    config = training.TrainConfig.create(
        preset="dare", batch_size=258, eval_batch_size=258, epochs=1, eval_every=100, max_steps=int(max_steps),
        strategy=strategy_name, jit_compile=False, optimizer=optimizer, verbose=0, in_memory_mb=int(in_memory_mb),
        model_overrides=dict(initializer="keras", top_k=5))
    spec = DatasetSpec.load(data_dir)
    run = training.SeedRun(data_dir, os.path.join(output_dir, "seed_0"), config, 0, spec, strategy,
                            training.workers.is_chief(strategy),
                            training.effective_model_config(config, spec, strategy),
                            print)
    result = run.run()
    np.savez(weights_out, *[w for w in run.model.get_weights()])
    users = store.read_examples(data_dir, "train", spec, partitions=run.plan.partitions)["uid"]
    loaded = store.load_store(data_dir, spec, run.plan.partitions)
    with open(weights_out.replace(".npz", ".json"), "w") as f:
        json.dump({"steps": result["steps"], "steps_per_epoch": run.plan.steps_per_epoch, "test": result["test"],
                   "partitions": run.plan.partitions, "train_users": sorted(set(users.tolist())),
                   "store_clicks": int(len(loaded.items))}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
