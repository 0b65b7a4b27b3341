"""dare_tf._faces: a package's face imports each public name's module on first use, and
lists what the package's modules declare without importing them."""

import sys

import pytest

from dare_tf._faces import lazy_face, scan_modules


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
