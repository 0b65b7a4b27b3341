"""The registry of the search stage's variants: each `BehaviorSearch` subclass
registers itself by name (`register_search`); `ModelConfig.search` names one,
and `DareModel` builds it (`build_search`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import keras

if TYPE_CHECKING:
    from dare_tf.search.base import BehaviorSearch

__all__ = ["build_search", "offset_seed", "register_search", "search_class"]

SEARCHES: dict[str, type["BehaviorSearch"]] = {}


def register_search(name: str):
    """Class decorator: registers a `BehaviorSearch` subclass under `name`
    (the value of `ModelConfig.search`) and as a serializable Keras layer."""

    def register(cls):
        if name in SEARCHES:
            raise ValueError(f"register_search: {name!r} is already registered by {SEARCHES[name].__name__}")
        cls.search_name = name
        SEARCHES[name] = keras.saving.register_keras_serializable(package="dare_tf")(cls)
        return cls

    return register


def search_class(name: str) -> type["BehaviorSearch"]:
    """The registered search stage called `name` (its module imported on first use)."""
    from dare_tf.search import VARIANTS

    if name not in VARIANTS:
        raise ValueError(f"unknown search {name!r}; known searches: {sorted(VARIANTS)}")
    if name not in SEARCHES:
        importlib.import_module(f"dare_tf.search.{VARIANTS[name]}")
    return SEARCHES[name]


def build_search(config, seed: int | None = None) -> "BehaviorSearch":
    """The search stage a `ModelConfig` names, with the fields it reads.
    Refuses a `scorer` other than the dot product (the DIN activation unit)
    for a search that keeps a top K by its own scores."""
    kind = search_class(config.search)
    if config.scorer != "dot" and kind.keeps_top_k:
        raise ValueError(f"scorer={config.scorer!r}: the DIN activation unit scores a whole history; "
                         f"search={config.search!r} ranks by its own scores (use search='none')")
    return kind.from_model_config(config, seed)


def offset_seed(seed: int | None, offset: int) -> int | None:
    """A sub-layer's seed derived from the model's (`None` stays `None`)."""
    return None if seed is None else seed + offset
