"""The attention-dimension cut (the paper's efficiency claim): DARE's search
stage with narrower attention embeddings, its cost and its accuracy."""

from __future__ import annotations

import time

import numpy as np

from dare_tf.data.spec import MODEL_INPUTS
from dare_tf.layers.embedding import ATTENTION_ROLES


def search_stage(model):
    """A function `(inputs, history_signatures=None) -> output`: stage 1 alone,
    compiled with XLA on TensorFlow: the attention rows, then the model's
    search (the scores of every slot and the top K; ETA: signatures, Hamming
    ranking, top K and the K kept slots' scores, with the history's signatures
    computed or given; TWIN-V2: clustering, then the search over clusters;
    SDIM: the hash buckets of target and history and their matches)."""
    import keras

    layer = model.embedding

    def run(x, history_signatures=None):
        ids = model._unpack({k: x[k] for k in MODEL_INPUTS})
        emb = layer.combine(layer.lookup(*ids, roles=ATTENTION_ROLES), roles=ATTENTION_ROLES)
        query, keys, mask = emb["target_attention"], emb["history_attention"], ids[2] > 0
        if model.sampling is not None:
            return model.sampling.matches(query, keys, mask)
        keys, _, mask, bias = model.search_space(keys, keys, ids[3], mask)
        return model.search(query, keys, mask, ids[1], ids[3], score_bias=bias,
                            history_signatures=history_signatures)[0]

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
