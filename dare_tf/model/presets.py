"""The named models: each preset is a few `ModelConfig` overrides (the paper's
Table 1 rows and their ablations; a model variant is a search class in
`dare_tf.search` plus its preset here), built by `make_config` and
`build_model`. Importing it loads no Keras (`build_model` imports the model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dare_tf._faces import public, public_names
from dare_tf.model.config import ModelConfig

if TYPE_CHECKING:
    from dare_tf.model.dare_model import DareModel


# Each preset is a small dict of overrides of ModelConfig (reference.md's
# configurations of the paper's Table 1).
PRESETS: dict[str, dict[str, Any]] = {
    "dare": dict(coupling="decoupled", search="soft"),
    "twin": dict(coupling="shared", search="soft"),
    "twin_hard": dict(coupling="shared", search="hard"),
    "twin_proj": dict(coupling="projection", search="soft"),
    "twin_no_tr": dict(coupling="shared", search="soft", target_aware=False),
    "twin_4e": dict(coupling="four", search="soft"),
    "dare_no_tr": dict(coupling="decoupled", search="soft", target_aware=False),
    "eta": dict(coupling="shared", search="simhash", hash_bits=32),
    "sdim": dict(coupling="shared", search="sdim", num_hashes=8, hash_bits=3),
    "twin_v2": dict(coupling="shared", search="cluster", cluster_window=16),
    "din": dict(coupling="shared", search="none", scorer="din", use_position=False),
}
# Presets that are ablations of another row rather than rows of the paper's Table 1
# (`trainers.reproduce` trains every other preset by default).
ABLATIONS = ("dare_no_tr",)
PRESET_NOTES = {  # what a table says beneath a row that is not a model of the paper's Table 1
    "dare_no_tr": "DARE without target-aware representation (an ablation: it shows what the target-aware "
                  "representation adds; on a small log it may score as high)",
    "twin_no_tr": "TWIN without target-aware representation (an ablation)"}


@public("dare_tf")
def make_config(preset: str, num_items: int, num_categories: int, **overrides) -> ModelConfig:
    """Builds the `ModelConfig` of a named preset with overrides applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {sorted(PRESETS)}")
    fields = dict(PRESETS[preset])
    fields.update(overrides)
    return ModelConfig.from_dict(dict(num_items=num_items, num_categories=num_categories, **fields))



@public("dare_tf")
def build_model(preset: str, num_items: int, num_categories: int, max_len: int = 200,
                seed: int | None = None, jit_compile_dense: bool = True,
                sparse_embedding_gradients: bool = True, **overrides) -> "DareModel":
    """Builds a named preset (`dare_tf.PRESETS`) as a built `DareModel`.

    `num_items` and `num_categories` are vocabulary sizes including padding
    row 0; `overrides` are `ModelConfig` fields.
    """
    from dare_tf.model.dare_model import DareModel

    config = make_config(preset, num_items, num_categories, max_len=max_len, **overrides)
    model = DareModel(config, seed=seed, name=preset, jit_compile_dense=jit_compile_dense,
                      sparse_embedding_gradients=sparse_embedding_gradients)
    model.build()
    return model


public_names("dare_tf", "PRESETS")
