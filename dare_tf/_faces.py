"""A package's public face from one table: each public name is declared once,
with the module that defines it, and imported from there on first use (PEP 562).
Importing a package therefore costs nothing and changes nothing (no
environment variable, no file descriptor, no other import); a program defines
and parses its flags before TensorFlow loads."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_face(package: str, exports: dict[str, str], submodules=()) -> tuple[Callable, Callable, list[str]]:
    """`(__getattr__, __dir__, __all__)` of `package`: `exports` maps each public
    name to the module that defines it (or to `(module, name there)`);
    `submodules` are public modules of the package, by their short names."""
    submodules = tuple(submodules)

    def __getattr__(name):
        if name in exports:
            module, attribute = exports[name] if isinstance(exports[name], tuple) else (exports[name], name)
            return getattr(importlib.import_module(module), attribute)
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    public = sorted({*exports, *submodules})

    def __dir__():
        return public

    return __getattr__, __dir__, public
