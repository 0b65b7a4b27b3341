"""What `DareModel` takes: the per-example inputs (training, `call`, `explain`) and the
user-major inputs of `rank` (serving: N candidates per user against one history),
checked and cast to int32 ids. Backend-neutral (`keras.ops`)."""

from __future__ import annotations

import dataclasses

from keras import ops

from dare_tf.data.spec import MODEL_INPUTS, RANK_INPUTS


def example_ids(inputs, max_len: int):
    """`(target_item, target_category [B], hist_items, hist_categories [B, L])` of a
    per-example inputs dict."""
    if not isinstance(inputs, dict):
        raise TypeError(f"DareModel expects a dict with keys {MODEL_INPUTS}, got {type(inputs).__name__}")
    missing = [k for k in MODEL_INPUTS if k not in inputs]
    if missing:
        raise KeyError(f"DareModel inputs lack {missing}; expected keys {MODEL_INPUTS}")
    ti, tc, hi, hc = (ops.cast(inputs[k], "int32") for k in MODEL_INPUTS)
    if hi.shape[1] is not None and hi.shape[1] != max_len:
        raise ValueError(f"DareModel: hist_items has length {hi.shape[1]}, but the model was "
                         f"built for max_len={max_len}")
    return ti, tc, hi, hc


def rank_ids(inputs, max_len: int):
    """`rank`'s inputs -> the per-target ids `(target_item, target_category [U * N],
    hist_items, hist_categories [U, L])` (targets in user-major order) and N."""
    if not isinstance(inputs, dict) or any(k not in inputs for k in RANK_INPUTS):
        raise KeyError(f"DareModel.rank expects a dict with keys {RANK_INPUTS}, got "
                       f"{sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__}")
    hist_items, hist_categories, items, categories = (ops.cast(inputs[k], "int32") for k in RANK_INPUTS)
    if len(items.shape) != 2 or len(hist_items.shape) != 2:
        raise ValueError(f"DareModel.rank: candidates must be [users, N] and histories [users, L]; got "
                         f"{tuple(items.shape)} and {tuple(hist_items.shape)}")
    if hist_items.shape[1] is not None and hist_items.shape[1] != max_len:
        raise ValueError(f"DareModel.rank: hist_items has length {hist_items.shape[1]}, but the model was "
                         f"built for max_len={max_len}")
    return (ops.reshape(items, (-1,)), ops.reshape(categories, (-1,)), hist_items, hist_categories), \
        ops.shape(items)[1]


@dataclasses.dataclass(frozen=True)
class ExampleEmbeddings:
    """What `DareModel.embeddings` returns.

    Attributes:
        ids: `(target_item, target_category, hist_items, hist_categories)`,
            dense int32 ids `[B]`, `[B]`, `[B, L]`, `[B, L]` (0 pads).
        roles: each looked-up role's embeddings: `target_attention` `[B, Da]`,
            `history_attention` `[B, L, Da]`, `target_representation`
            `[B, Dr]`, `history_representation` `[B, L, Dr]`.
    """

    ids: tuple
    roles: dict

    @property
    def mask(self):
        """`[B, L]` bool: the real (non-padding) history slots."""
        return ops.greater(self.ids[2], 0)
