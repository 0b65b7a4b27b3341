"""The search stage (stage 1) as a family: one `BehaviorSearch` subclass per variant.

| `ModelConfig.search` | class | models |
|---|---|---|
| `soft` | `SoftTopKSearch` | TWIN, DARE and their ablations |
| `hard` | `HardTopKSearch` | TWIN-hard |
| `simhash` | `SimHashTopKSearch` | ETA |
| `cluster` | `ClusterTopKSearch` | TWIN-V2 |
| `sdim` | `HashSamplingSearch` | SDIM |
| `none` | `FullHistorySearch` | DIN |

A new variant is one module here with a `@register_search("name")` subclass,
its line in `VARIANTS`, its test, and a preset line in `dare_tf.config.PRESETS`.

Naming the searches (`VARIANTS`: a config's validation, a program's flags)
imports no Keras; a variant's module is imported when its class is first
asked for (`search_class`, `SEARCHES`, or its name here), so that a
program's `--help` never loads TensorFlow.
"""

import importlib

from dare_tf._faces import lazy_face

# Every registered search, by its `ModelConfig.search` name, and the module here that defines it.
VARIANTS = {"soft": "soft", "hard": "hard", "simhash": "simhash", "cluster": "cluster", "sdim": "sampling",
            "none": "full_history"}

# Public name -> the module that defines it.
_EXPORTS = {
    "PADDING_SCORE": "base", "BehaviorSearch": "base", "SearchResult": "base", "TopKSearch": "base",
    "build_search": "base",
    "register_search": "base", "scaled_dot_scores": "base", "search_class": "base",
    "SoftTopKSearch": "soft", "HardTopKSearch": "hard", "hard_search_priority": "hard",
    "SimHashTopKSearch": "simhash", "hamming_priority": "simhash", "ClusterTopKSearch": "cluster",
    "HashSamplingSearch": "sampling", "FullHistorySearch": "full_history",
}


def import_variants() -> dict:
    """Imports every variant's module; returns the registry (name -> class)."""
    for module in VARIANTS.values():
        importlib.import_module(f"dare_tf.search.{module}")
    return importlib.import_module("dare_tf.search.base").SEARCHES


_face_getattr, __dir__, __all__ = lazy_face(__name__, {k: f"dare_tf.search.{m}" for k, m in _EXPORTS.items()})
__all__ = sorted([*__all__, "SEARCHES", "VARIANTS", "import_variants"])


def __getattr__(name):
    if name == "SEARCHES":  # the registry, every variant imported
        return import_variants()
    return _face_getattr(name)
