"""The search stage (stage 1) as a family: one `BehaviorSearch` subclass per variant.

`VARIANTS` lists them by their `ModelConfig.search` name (`soft`: TWIN and
DARE, `hard`: TWIN-hard, `simhash`: ETA, `cluster`: TWIN-V2, `sdim`: SDIM,
`none`: DIN); each class's docstring says what it does and which models use
it.

A new variant is its module here with a `@register_search("name")` subclass,
its test, and a preset line in `dare_tf.model.presets.PRESETS`: nothing else. This
package's face is read from its modules (`dare_tf._faces.scan_modules`): the
registered names make `VARIANTS`, and each module's `__all__` (or its public
classes and functions) the public names.

Naming the searches (`VARIANTS`: a config's validation, a program's flags)
imports no Keras; a variant's module is imported when its class is first
asked for (`search_class`, `SEARCHES`, or its name here), so that a
program's `--help` never loads TensorFlow.
"""

import importlib

from dare_tf._faces import lazy_face, scan_modules

# Public name -> the module that defines it; registered search name -> its module here.
_EXPORTS, VARIANTS = scan_modules(__name__, __path__[0], decorator="register_search")
# The behaviour scorers of the whole-history search (`FullHistorySearch`, `ModelConfig.scorer`).
SCORERS = ("dot", "din")


def import_variants() -> dict:
    """Imports every variant's module; returns the registry (name -> class)."""
    for module in VARIANTS.values():
        importlib.import_module(f"dare_tf.search.{module}")
    return importlib.import_module("dare_tf.search.registry").SEARCHES


_face_getattr, __dir__, __all__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted([*__all__, "SCORERS", "SEARCHES", "VARIANTS", "import_variants"])


def __getattr__(name):
    if name == "SEARCHES":  # the registry, every variant imported
        return import_variants()
    return _face_getattr(name)
