"""The attention-dimension cut (the paper's efficiency claim): DARE's search
stage with narrower attention embeddings, its cost and its accuracy."""

from __future__ import annotations

import os
import time

import numpy as np

from dare_tf.data.storage.schema import MODEL_INPUTS
from dare_tf.layers.embedding_tables import ATTENTION_ROLES


def search_stage(model):
    """A function `(inputs, history_signatures=None) -> output`: stage 1 alone,
    compiled with XLA on TensorFlow: the attention rows, then the model's
    search without any representation read (`BehaviorSearch.search_only`;
    ETA takes the history's precomputed signatures)."""
    import keras

    def run(x, history_signatures=None):
        from dare_tf.model.inputs import input_keys

        embedded = model.embeddings({k: x[k] for k in input_keys(model.model_config.fields)}, roles=ATTENTION_ROLES)
        precomputed = {} if history_signatures is None else {"history_signatures": history_signatures}
        return model.search.search_only(embedded.roles["target_attention"], embedded.roles["history_attention"],
                                        embedded.mask, embedded.ids.target_category, embedded.ids.hist_categories,
                                        **precomputed)

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(run, jit_compile=True, autograph=False)
    return run


def time_search_stage(model, x: dict, repeats: int = 15) -> float:
    """Median seconds per example of `search_stage` on the batch `x` (after a warm-up call)."""
    from keras import ops

    fn = search_stage(model)
    ops.convert_to_numpy(fn(x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ops.convert_to_numpy(fn(x))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / len(x[MODEL_INPUTS[0]])


def train_widths(data_dir: str, cfg, runs: dict[int, str], rep_dim: int, max_len: int, directory: str, say,
                 overwrite: bool = False) -> dict[int, str]:
    """`runs` (attention width -> a given DARE run) with every width of
    `cfg.attention_dims` it lacks trained into `directory/attention_<width>`:
    as the first given run was trained (its recorded config, the attention
    widths changed), so that the cut compares widths, not schedules; without
    one, `cfg`'s schedule at representation width `rep_dim` and history length
    `max_len` (the given runs')."""
    from dare_tf.run_directory import RunDirectory
    from dare_tf.training import TrainConfig, train

    given = next(iter(runs.values()), None)
    recorded = (RunDirectory(given).identity() or {}).get("train_config") if given else None
    for width in cfg.attention_dims:
        if width in runs:
            continue
        run_dir = os.path.join(directory, f"attention_{width}")
        say(f"  training DARE with attention width {width} (representation {rep_dim}) in {run_dir}"
            + (f", as {given} was trained" if recorded else ""))
        widths = dict(attention_embedding_dim=width, attention_position_dim=width)
        if recorded:
            base = TrainConfig.from_identity(recorded, verbose=0)
            config = base.replace(model_overrides={**base.model_overrides, **widths})
        else:
            config = TrainConfig.create(
                preset="dare", batch_size=cfg.batch_size * 2, eval_batch_size=4096, epochs=cfg.dimension_epochs,
                eval_every=10**9, learning_rate=cfg.learning_rate, seeds=(cfg.seed,), verbose=0,
                model_overrides=dict(embedding_dim=rep_dim, max_len=max_len, top_k=min(20, max_len), **widths))
        train(data_dir, run_dir, config, report=say, overwrite=overwrite)
        runs[width] = run_dir
    return runs
