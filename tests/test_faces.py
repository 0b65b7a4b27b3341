"""dare_tf._faces: a package's face imports each public name's module on first use, and
lists what the package's modules declare without importing them."""

import os
import sys

import pytest

from dare_tf._faces import lazy_face, scan_modules
from tests.conftest import REPO


def test_a_lazy_face_imports_on_first_use_and_names_what_is_missing():
    getattr_, dir_, public = lazy_face("pkg", {"dumps": "json", "Loads": ("json", "loads")}, ["sub"])
    import json

    assert public == ["Loads", "dumps", "sub"] and dir_() == public
    assert getattr_("dumps") is json.dumps and getattr_("Loads") is json.loads
    with pytest.raises(AttributeError, match="^module 'pkg' has no attribute 'nothing'$"):
        getattr_("nothing")


def test_scanning_reads_all_or_public_definitions_without_importing(tmp_path):
    (tmp_path / "declared.py").write_text('import keras_that_is_not_installed\n__all__ = ["A", "B"]\n'
                                          'A = 1\nB = 2\ndef c():\n    pass\n')
    (tmp_path / "plain.py").write_text('class Kept:\n    pass\n\n\ndef _hidden():\n    pass\n\n\n'
                                       '@register("x")\nclass Registered:\n    pass\n')
    before = set(sys.modules)
    exports, registered = scan_modules("pkg", str(tmp_path), decorator="register")
    assert exports == {"A": "pkg.declared", "B": "pkg.declared", "Kept": "pkg.plain", "Registered": "pkg.plain"}
    assert registered == {"x": "plain"}
    assert set(sys.modules) == before  # nothing imported (declared.py's import would fail)


def test_the_generator_reads_each_declaration_without_importing(tmp_path):
    """`@public(face)` on a definition (under `name=` an alias), `public_names(face, ...)`
    beside constants, a package's `__init__` as the package itself."""
    from dare_tf._api_gen import declarations, render

    (tmp_path / "sub").mkdir()
    (tmp_path / "__init__.py").write_text('@public("p")\ndef top():\n    pass\n')
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "mod.py").write_text(
        'import keras_that_is_not_installed\nA = 1\n\n\n@public("p", "p.sub")\n@dataclass\nclass C:\n    pass\n\n\n'
        '@public("p", name="write_it")\ndef write():\n    pass\n\n\ndef private():\n    pass\n\n\n'
        'public_names("p.sub", "A")\n')
    before = set(sys.modules)
    faces = declarations(str(tmp_path), "p")
    assert faces == {"p": {"C": "p.sub.mod", "top": "p", "write_it": ("p.sub.mod", "write")},
                     "p.sub": {"A": "p.sub.mod", "C": "p.sub.mod"}}
    assert set(sys.modules) == before
    namespace = {}
    exec(render(faces), namespace)
    assert namespace["FACES"] == faces


def test_the_packages_faces_are_generated_from_their_declarations():
    """dare_tf/_api.py is what `python -m dare_tf._api_gen` writes now (run it after
    declaring a public name), and every name it lists is bound where it is declared."""
    import ast

    from dare_tf import _api, _api_gen

    root = os.path.join(REPO, "dare_tf")
    with open(os.path.join(root, "_api.py")) as f:
        assert f.read() == _api_gen.render(_api_gen.declarations(root)), "run python -m dare_tf._api_gen"
    for face, names in _api.FACES.items():
        for name, where in names.items():
            module, attribute = where if isinstance(where, tuple) else (where, name)
            path = os.path.join(REPO, *module.split("."))
            path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
            with open(path) as f:
                tree = ast.parse(f.read())
            bound = set()
            for node in tree.body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                    bound.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    bound |= {t.id for t in targets if isinstance(t, ast.Name)}
                elif isinstance(node, ast.ImportFrom):
                    bound |= {a.asname or a.name for a in node.names}
            assert attribute in bound, f"{face}.{name}: {module} binds no {attribute}"


def test_every_public_name_is_in_the_api_reference():
    """Each name of a generated face is documented in docs/api/ (its own entry or its module's)."""
    import glob
    import re

    from dare_tf._api import FACES

    entries = set()
    for path in glob.glob(os.path.join(REPO, "docs", "api", "*.md")):
        with open(path) as f:
            entries |= set(re.findall(r"^::: (\S+)", f.read(), re.M))
    missing = [f"{face}.{name}" for face, names in FACES.items() for name, where in names.items()
               if not {".".join(where) if isinstance(where, tuple) else f"{where}.{name}",
                       where[0] if isinstance(where, tuple) else where} & entries]
    assert missing == []
