"""The attention-dimension cut (the paper's efficiency claim): DARE's search
stage with narrower attention embeddings, its cost and its accuracy."""

from __future__ import annotations

import time

import numpy as np

from dare_tf.data.storage.schema import MODEL_INPUTS
from dare_tf.layers.embedding import ATTENTION_ROLES


def search_stage(model):
    """A function `(inputs, history_signatures=None) -> output`: stage 1 alone,
    compiled with XLA on TensorFlow: the attention rows, then the model's
    search without any representation read (`BehaviorSearch.search_only`;
    ETA takes the history's precomputed signatures)."""
    import keras

    def run(x, history_signatures=None):
        from dare_tf.model_inputs import input_keys

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
