"""dare_tf.search.registry: variants registered by name, imported on first use."""

import subprocess
import sys

import pytest

from dare_tf.search import VARIANTS
from dare_tf.search.registry import SEARCHES, offset_seed, register_search, search_class


def test_every_named_variant_is_its_registered_class():
    for name in VARIANTS:
        cls = search_class(name)
        assert cls.search_name == name and SEARCHES[name] is cls


def test_unknown_and_twice_registered_names_are_refused():
    with pytest.raises(ValueError, match=r"^unknown search 'cosine'; known searches: \['cluster', "):
        search_class("cosine")
    with pytest.raises(ValueError, match=r"^register_search: 'soft' is already registered by "):
        register_search("soft")(type("Again", (), {}))


def test_a_variants_module_loads_only_when_asked_for():
    code = ("import sys; from dare_tf.search import VARIANTS; print('dare_tf.search.soft' in sys.modules); "
            "from dare_tf.search.registry import search_class; search_class('soft'); "
            "print('dare_tf.search.soft' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stderr[-2000:]


def test_offset_seeds():
    assert offset_seed(None, 3) is None and offset_seed(10, 3) == 13
