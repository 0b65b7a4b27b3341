"""What `DareModel` takes: the per-example inputs (training, `call`, `explain`) and the
user-major inputs of `rank` (serving: N candidates per user against one history),
checked and cast to int32 ids. Backend-neutral (`keras.ops`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from keras import ops

from dare_tf.data.storage.fields import FieldSchema
from dare_tf.data.storage.schema import MODEL_INPUTS, RANK_INPUTS, input_role


class Ids(NamedTuple):
    """A batch's dense int32 ids (0 pads): the targets' `[B]`, the histories'
    `[B, L]`, and each `BehaviorField`'s (`target_fields` without the
    history-only ones)."""

    target_item: object
    target_category: object
    hist_items: object
    hist_categories: object
    target_fields: dict = {}
    history_fields: dict = {}

    def lookup_args(self) -> tuple:
        """`BehaviorEmbedding.lookup`'s positional ids."""
        return self.target_item, self.target_category, self.hist_items, self.hist_categories

    def field_kwargs(self) -> dict:
        """`BehaviorEmbedding.lookup`'s field ids."""
        return {"target_fields": self.target_fields, "history_fields": self.history_fields}


def input_keys(fields=()) -> list[str]:
    """Every per-example input of a model with `fields`: `MODEL_INPUTS`, then the
    fields' (`FieldSchema.keys`)."""
    return [*MODEL_INPUTS, *FieldSchema.of(fields).keys()]


def _field_ids(inputs, fields, target: str, what: str):
    schema = FieldSchema.of(fields)
    missing = [k for k in schema.keys(target) if k not in inputs]
    if missing:
        raise KeyError(f"{what} inputs lack {missing}: the model's fields "
                       f"({', '.join(schema.names)}) each need their ids")
    return ({schema.field_of(k): ops.cast(inputs[k], "int32") for k in schema.inputs(target)},
            {schema.field_of(k): ops.cast(inputs[k], "int32") for k in schema.inputs("hist")})


def example_ids(inputs, max_len: int, fields=()) -> Ids:
    """The `Ids` of a per-example inputs dict (`target_item`, `target_category`
    `[B]`, `hist_items`, `hist_categories` `[B, L]`, and per field `hist_<name>`
    `[B, L]` and `target_<name>` `[B]`)."""
    if not isinstance(inputs, dict):
        raise TypeError(f"DareModel expects a dict with keys {MODEL_INPUTS}, got {type(inputs).__name__}")
    missing = [k for k in MODEL_INPUTS if k not in inputs]
    if missing:
        raise KeyError(f"DareModel inputs lack {missing}; expected keys {MODEL_INPUTS}")
    ti, tc, hi, hc = (ops.cast(inputs[k], "int32") for k in MODEL_INPUTS)
    if hi.shape[1] is not None and hi.shape[1] != max_len:
        raise ValueError(f"DareModel: hist_items has length {hi.shape[1]}, but the model was "
                         f"built for max_len={max_len}")
    return Ids(ti, tc, hi, hc, *_field_ids(inputs, fields, "target", "DareModel"))


def rank_ids(inputs, max_len: int, fields=()) -> tuple[Ids, object]:
    """`rank`'s inputs -> the per-target `Ids` (targets `[U * N]` in user-major
    order, histories `[U, L]`; per field `candidate_<name>` `[U, N]` and
    `hist_<name>` `[U, L]`) and N."""
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
    targets, histories = _field_ids(inputs, fields, "candidate", "DareModel.rank")
    return Ids(ops.reshape(items, (-1,)), ops.reshape(categories, (-1,)), hist_items, hist_categories,
               {name: ops.reshape(ids, (-1,)) for name, ids in targets.items()}, histories), ops.shape(items)[1]


@dataclasses.dataclass(frozen=True)
class ExampleEmbeddings:
    """What `DareModel.embeddings` returns.

    Attributes:
        ids: the batch's `Ids` (`target_item`, `target_category`, `hist_items`,
            `hist_categories`, dense int32 ids `[B]`, `[B]`, `[B, L]`,
            `[B, L]`, 0 pads; and the fields').
        roles: each looked-up role's embeddings: `target_attention` `[B, Da]`,
            `history_attention` `[B, L, Da]`, `target_representation`
            `[B, Dr]`, `history_representation` `[B, L, Dr]`.
    """

    ids: tuple
    roles: dict

    @property
    def mask(self):
        """`[B, L]` bool: the real (non-padding) history slots."""
        return ops.greater(self.ids.hist_items, 0)


def dummy_inputs(config, batch_size: int = 2) -> dict[str, np.ndarray]:
    """Inputs of `batch_size` examples of ones for a `ModelConfig` (every field's
    too), histories at its `max_len`: what builds a model's weights."""
    length = config.max_len
    return {
        "target_item": np.ones((batch_size,), np.int32),
        "target_category": np.ones((batch_size,), np.int32),
        "hist_items": np.ones((batch_size, length), np.int32),
        "hist_categories": np.ones((batch_size, length), np.int32),
        **{key: np.ones((batch_size, length) if input_role(key) == "hist" else (batch_size,), np.int32)
           for key in FieldSchema.of(config.fields).keys()},
    }
