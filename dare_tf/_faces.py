"""A package's public face: each public name is declared once, where it is defined
(`public`, `public_names`); `python -m dare_tf._api_gen` writes the faces' table
(`dare_tf._api`) from those declarations, and a package's `__getattr__` imports
a name from its module on first use (PEP 562). Importing a package therefore
costs nothing and changes nothing (no environment variable, no file descriptor,
no other import); a program defines and parses its flags before TensorFlow
loads."""

from __future__ import annotations

import ast
import importlib
import os
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


def _literal_strings(node) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def scan_modules(package: str, path: str, decorator: str | None = None) -> tuple[dict, dict]:
    """Reads (without importing) every module of the package directory `path`:
    returns `(exports, registered)`. `exports` maps each public name to its
    module's dotted name: the names of the module's `__all__` where it has one,
    else its top-level classes and functions without a leading underscore.
    `registered` maps the first argument of each `@decorator("name")` on a
    top-level class to that module's short name."""
    exports, registered = {}, {}
    for file in sorted(os.listdir(path)):
        short, ext = os.path.splitext(file)
        if ext != ".py" or short.startswith("_"):
            continue
        with open(os.path.join(path, file), encoding="utf-8") as f:
            tree = ast.parse(f.read(), file)
        declared, defined = None, []
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in node.targets):
                declared = _literal_strings(node.value)
            elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                if not node.name.startswith("_"):
                    defined.append(node.name)
                for d in getattr(node, "decorator_list", []):
                    if (decorator and isinstance(node, ast.ClassDef) and isinstance(d, ast.Call)
                            and isinstance(d.func, ast.Name) and d.func.id == decorator and d.args
                            and isinstance(d.args[0], ast.Constant)):
                        registered[d.args[0].value] = short
        exports.update(dict.fromkeys(defined if declared is None else declared, f"{package}.{short}"))
    return exports, registered


# -- one declaration per public name, the faces generated from them -----------------------------

API_MODULE = "dare_tf._api"


def public(*faces: str, name: str | None = None):
    """Declares the decorated class or function public in each package `faces`
    (under `name`, default its own). Changes nothing at run time: `python -m
    dare_tf._api_gen` reads the declarations and writes the faces' table."""
    del faces, name
    return lambda definition: definition


def public_names(face: str, *names: str) -> None:
    """Declares module-level names (constants) of the calling module public in `face`."""
    del face, names


def face_of(package: str) -> dict:
    """The generated table of `package`'s public names (`dare_tf._api`, written by
    `python -m dare_tf._api_gen`)."""
    return importlib.import_module(API_MODULE).FACES.get(package, {})
