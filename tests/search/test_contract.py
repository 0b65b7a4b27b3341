"""The contract every registered search stage keeps (the list comes from the registry):
output shapes, padding never kept, config round trip, `slot_scores` agreeing with `call`."""

import dataclasses

import keras
import numpy as np
import pytest

from dare_tf.model.config import ModelConfig

from dare_tf.model.presets import PRESETS
from dare_tf.search import SEARCHES, SearchResult, build_search
from tests.conftest import random_batch
from tests.helpers import assert_layer_serializes

B, L, DA, DR, K = 5, 9, 8, 6, 4


def _inputs(rng):
    x = random_batch(rng, B, L, 50, 4, lengths=[L, 6, 2, 0, 5])
    q = rng.normal(size=(B, DA)).astype("float32")
    k = rng.normal(size=(B, L, DA)).astype("float32")
    v = rng.normal(size=(B, L, DR)).astype("float32")
    return q, k, v, x["hist_items"] > 0, x["target_category"], x["hist_categories"]


def _search(name):
    config = ModelConfig(num_items=50, num_categories=4, max_len=L, top_k=K, position_dim=2,
                         **{"search": name, "coupling": "shared", "hash_bits": 3, "num_hashes": 2,
                            "cluster_window": 3, **({"scorer": "din"} if name == "none" else {})})
    return build_search(config, seed=3)


def _np(t):
    return None if t is None else np.asarray(keras.ops.convert_to_numpy(t))


def test_every_search_has_a_preset_and_every_preset_a_search():
    assert {p.get("search", "soft") for p in PRESETS.values()} == set(SEARCHES)


def test_one_registry_read_from_the_modules_a_new_variant_is_its_module_only():
    """`VARIANTS` and the package's public names come from reading the modules
    (`dare_tf._faces.scan_modules`, tests/test_faces.py): the registered names are the
    classes' own, and every public name resolves to its module's object."""
    import os
    import re

    import dare_tf.search as search

    assert {name: cls.__module__ for name, cls in SEARCHES.items()} == {
        name: f"dare_tf.search.{module}" for name, module in search.VARIANTS.items()}
    assert {cls.__name__ for cls in SEARCHES.values()} <= set(search.__all__)
    assert all(getattr(search, name) is getattr(__import__(module, fromlist=[name]), name)
               for name, module in search._EXPORTS.items())
    # The guide's table documents every variant with its class.
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "library.md")) as f:
        rows = dict(re.findall(r"^\| `(\w+)` \| `(\w+)` \|", f.read(), re.M))
    assert {name: rows.get(name) for name in SEARCHES} == {name: cls.__name__ for name, cls in SEARCHES.items()}


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_contract(rng, name):
    q, k, v, mask, tc, hc = _inputs(rng)
    search = _search(name)
    assert type(search).search_name == name
    result = SearchResult.of(search(q, k, v, mask, tc, hc))  # the layer's dict, typed
    found = {f.name: (_np(getattr(result, f.name)) if getattr(result, f.name) is not None and f.name != "explain"
                      else getattr(result, f.name)) for f in dataclasses.fields(result)}
    kept = search.kept(L)
    positions = found["positions"]
    assert positions.shape == (B, kept) and positions.dtype == np.int32
    assert set(found["explain"]) == set(search.explain_outputs)
    slot_scores = _np(search.slot_scores(q, k, mask, tc, hc))
    assert slot_scores.shape == (B, L)
    if result.pools_itself:  # a stage that pools itself weighs every slot; padding weighs 0
        assert found["pooled"].shape == (B, DR) and np.isfinite(found["pooled"]).all()
        assert (found["weights"][~mask] == 0).all()
        np.testing.assert_allclose(found["weights"][mask], slot_scores[mask], rtol=1e-6)
        assert found["scores"] is found["valid"] is found["values"] is None
    else:
        valid, scores = found["valid"], found["scores"]
        assert found["pooled"] is found["weights"] is None
        assert valid.shape == scores.shape == (B, kept) and found["values"].shape == (B, kept, DR)
        assert np.isfinite(scores[valid]).all()
        if not search.keeps_top_k:  # every slot kept, scored by slot_scores
            np.testing.assert_allclose(scores[valid], slot_scores[valid], rtol=1e-6)
        # Padding is never kept as valid; a valid kept slot is a real behaviour (or a
        # cluster at one).
        assert np.take_along_axis(mask, positions, 1)[valid].all()
        assert not valid[3].any()  # the empty history
        if name != "cluster":  # the kept slots' own representations (clusters hold means)
            np.testing.assert_allclose(found["values"], np.take_along_axis(v, positions[..., None], 1))
        # What is kept is the top of slot_scores (ties aside), most relevant first.
        for b in range(B if search.keeps_top_k else 0):
            order = positions[b][valid[b]]
            ranked = slot_scores[b][order]
            assert (np.diff(ranked) <= 1e-5).all(), (name, b, ranked)
            if len(order):
                rest = np.setdiff1d(np.flatnonzero(slot_scores[b] > -1e9), order)
                assert rest.size == 0 or slot_scores[b][rest].max() <= ranked.min() + 1e-5
    # With values=None a slot-selecting stage returns no representations (they are looked up later).
    if search.selects_slots:
        late = search(q, k, None, mask, tc, hc)
        assert late["values"] is None
        np.testing.assert_array_equal(_np(late["positions"]), positions)


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_config_round_trip(rng, name):
    q, k, v, mask, tc, hc = _inputs(rng)
    restored = assert_layer_serializes(_search(name), q, k, v, mask, tc, hc)
    assert type(restored) is SEARCHES[name]


def test_unknown_search_is_named():
    with pytest.raises(ValueError, match=r"^ModelConfig.search: 'fuzzy' is not one of \("):
        ModelConfig(num_items=5, num_categories=3, search="fuzzy")


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_contract_user_major(rng, name):
    """`search_users` (N targets per user, one history each) = `call` on the N copies
    of each history, for every variant (keys, values or none, categories)."""
    users, n = 3, 4
    q, k, v, mask, tc, hc = _inputs(rng)
    k, v, mask, hc = k[:users], v[:users], mask[:users], hc[:users]
    queries = rng.normal(size=(users, n, DA)).astype("float32")
    categories = rng.integers(1, 4, (users, n))
    search = _search(name)
    repeat = lambda x: np.repeat(x, n, axis=0)  # noqa: E731
    for values in ((v, None) if search.selects_slots else (v,)):
        got = search.search_users(queries, k, values, mask, categories, hc)
        want = search(queries.reshape(-1, DA), repeat(k), None if values is None else repeat(v), repeat(mask),
                      categories.reshape(-1), repeat(hc))
        assert set(got) == set(want) and set(got["explain"]) == set(want["explain"])
        for key in set(want) - {"explain"}:
            if want[key] is None:
                assert got[key] is None, key
                continue
            assert _np(got[key]).shape == _np(want[key]).shape, key
            np.testing.assert_allclose(_np(got[key]), _np(want[key]), atol=1e-5, err_msg=key)
        for key in want["explain"]:
            np.testing.assert_array_equal(_np(got["explain"][key]), _np(want["explain"][key]))
