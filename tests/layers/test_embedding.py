import dataclasses

import numpy as np
import pytest

from dare_tf.layers import BehaviorEmbedding

from tests.conftest import random_batch


def call(layer, x):
    return {k: np.asarray(v) for k, v in layer(
        x["target_item"], x["target_category"], x["hist_items"], x["hist_categories"]).items()}


def table(layer, set_name, field):
    return np.asarray(layer.tables[set_name][field])


def numpy_embed(layer, set_name, ids, positions, proj=None):
    parts = []
    for field, idx in (("item", ids[0]), ("category", ids[1]), ("position", positions)):
        e = table(layer, set_name, field)[idx]
        if proj is not None:
            e = e @ np.asarray(layer.projections[f"{proj}_{field}"])
        parts.append(e)
    return np.concatenate(parts, -1)


@pytest.mark.parametrize("coupling", ["shared", "decoupled", "four", "projection"])
def test_embeddings_match_numpy_lookup(rng, coupling):
    b, length = 3, 7
    x = random_batch(rng, b, length, 30, 6)
    att = 4 if coupling in ("decoupled", "four") else None
    layer = BehaviorEmbedding(30, 6, embedding_dim=5, position_dim=3, attention_embedding_dim=att,
                              attention_position_dim=2 if att else None, num_positions=50,
                              coupling=coupling)
    out = call(layer, x)
    hist_pos = np.broadcast_to(length - np.arange(length), (b, length))  # slot j -> L - j
    tgt_pos = np.zeros(b, int)
    for role, set_name in layer.table_names().items():
        side = role.split("_")[0]
        ids = ((x["target_item"], x["target_category"]) if side == "target"
               else (x["hist_items"], x["hist_categories"]))
        ref = numpy_embed(layer, set_name, ids, tgt_pos if side == "target" else hist_pos,
                          proj=role if coupling == "projection" else None)
        np.testing.assert_allclose(out[role], ref, rtol=1e-5, atol=1e-7)
    sets = set(layer.table_names().values())
    assert len(sets) == {"shared": 1, "decoupled": 2, "four": 4, "projection": 1}[coupling]
    if att:
        assert out["history_attention"].shape == (b, length, 2 * 4 + 2)
        assert out["history_representation"].shape == (b, length, 2 * 5 + 3)


def test_shared_gives_identical_attention_and_representation(rng):
    x = random_batch(rng, 2, 5, 10, 4)
    out = call(BehaviorEmbedding(10, 4, 3, 2, num_positions=10, coupling="shared"), x)
    np.testing.assert_array_equal(out["history_attention"], out["history_representation"])


def test_without_position(rng):
    x = random_batch(rng, 2, 5, 10, 4)
    layer = BehaviorEmbedding(10, 4, 3, coupling="shared", use_position=False)
    assert call(layer, x)["history_attention"].shape == (2, 5, 6)
    assert "position" not in layer.tables["shared"]


def test_errors(rng):
    with pytest.raises(ValueError, match="coupling='tied' is not one of"):
        BehaviorEmbedding(10, 4, coupling="tied")
    with pytest.raises(ValueError, match="attention dims"):
        BehaviorEmbedding(10, 4, 8, attention_embedding_dim=4, coupling="shared")
    with pytest.raises(ValueError, match="num_positions=5 rows"):
        call(BehaviorEmbedding(10, 4, 3, num_positions=5), random_batch(rng, 1, 6, 10, 4))


def test_tables_larger_than_the_memory_are_refused_before_allocating():
    """A vocabulary of 2**31 - 1 items (what spec.json allows) needs 256 GiB of
    tables: refused in one line, not an out-of-memory crash; the count is exact."""
    import dare_tf

    with pytest.raises(ValueError, match=r"^BehaviorEmbedding: the embedding tables need 256\.0 GiB "
                                         r"\(2,147,483,647 items, 10 categories, .*more than the .* GiB of memory "
                                         r"available; check the vocabulary sizes"):
        dare_tf.build_model("dare", 2**31 - 1, 10, max_len=10)
    model = dare_tf.build_model("dare", 1000, 10, max_len=10, attention_embedding_dim=4)
    assert model.embedding.table_bytes() == sum(int(np.prod(w.shape)) * 4 for w in model.embedding.weights)


FIELDS = [dict(name="brand", vocabulary=9, embedding_dim=4, attention_embedding_dim=2),
          dict(name="gap", vocabulary=6, embedding_dim=3, attention_embedding_dim=2, history_only=True)]


def _with_fields(rng, x, length):
    b = len(x["target_item"])
    return ({"brand": rng.integers(1, 9, b)},
            {"brand": rng.integers(0, 9, (b, length)), "gap": rng.integers(0, 6, (b, length))})


@pytest.mark.parametrize("coupling", ["decoupled", "four", "projection"])
def test_fields_are_embedded_by_tables_of_their_own_between_category_and_position(rng, coupling):
    """Item, category, brand, gap and position against a numpy lookup of the layer's
    own tables (decoupled widths per field); the history-only gap is zeros on the
    target side."""
    b, length = 3, 5
    x = random_batch(rng, b, length, 30, 6)
    target_fields, history_fields = _with_fields(rng, x, length)
    shared = coupling == "projection"
    fields = [dict(f, attention_embedding_dim=f["embedding_dim"]) for f in FIELDS] if shared else FIELDS
    layer = BehaviorEmbedding(30, 6, embedding_dim=5, position_dim=3, attention_embedding_dim=None if shared else 4,
                              num_positions=50, coupling=coupling, fields=fields)
    out = {k: np.asarray(v) for k, v in layer(x["target_item"], x["target_category"], x["hist_items"],
                                               x["hist_categories"], target_fields, history_fields).items()}
    positions = {"target": np.zeros(b, int), "history": np.broadcast_to(length - np.arange(length), (b, length))}
    for role, set_name in layer.table_names().items():
        side = role.split("_")[0]
        ids = {"item": x["target_item" if side == "target" else "hist_items"],
               "category": x["target_category" if side == "target" else "hist_categories"],
               **(target_fields if side == "target" else history_fields), "position": positions[side]}
        parts = []
        for field in ("item", "category", "brand", "gap", "position"):
            if side == "target" and field == "gap":
                parts.append(np.zeros((b, table(layer, set_name, "gap").shape[1])))
                continue
            rows = table(layer, set_name, field)[ids[field]]
            parts.append(rows @ np.asarray(layer.projections[f"{role}_{field}"]) if shared else rows)
        np.testing.assert_allclose(out[role], np.concatenate(parts, -1), rtol=1e-5, atol=1e-7)
    if not shared:
        assert out["history_attention"].shape == (b, length, 2 * 4 + 2 + 2 + 3)
        assert out["target_representation"].shape == (b, 2 * 5 + 4 + 3 + 3)
        attention, representation = ("attention", "representation") if coupling == "decoupled" else (
            "history_attention", "history_representation")
        assert table(layer, attention, "brand").shape == (9, 2)
        assert table(layer, representation, "gap").shape == (6, 3)
    # The tables' bytes count the fields' tables.
    assert layer.table_bytes() == sum(int(np.prod(w.shape)) * 4 for w in layer.weights if "projection" not in w.path)


def test_fields_survive_serialization_and_history_at_reads_them_at_the_slots(rng):
    import keras

    b, length = 2, 6
    x = random_batch(rng, b, length, 30, 6)
    target_fields, history_fields = _with_fields(rng, x, length)
    layer = BehaviorEmbedding(30, 6, embedding_dim=5, position_dim=3, attention_embedding_dim=4, num_positions=50,
                              fields=FIELDS)
    out = layer(x["target_item"], x["target_category"], x["hist_items"], x["hist_categories"], target_fields,
                history_fields)
    again = keras.layers.deserialize(keras.layers.serialize(layer))
    again(x["target_item"], x["target_category"], x["hist_items"], x["hist_categories"], target_fields,
          history_fields)
    again.set_weights(layer.get_weights())
    assert [dataclasses.asdict(f) for f in again.fields] == [dataclasses.asdict(f) for f in layer.fields]
    restored = again(x["target_item"], x["target_category"], x["hist_items"], x["hist_categories"], target_fields,
                     history_fields)
    for role in out:
        np.testing.assert_allclose(np.asarray(restored[role]), np.asarray(out[role]), rtol=1e-6)
    slots = np.array([[5, 2], [0, 3]])
    at = np.asarray(layer.history_at("history_attention", x["hist_items"], x["hist_categories"], slots,
                                     history_fields))
    np.testing.assert_allclose(at, np.take_along_axis(np.asarray(out["history_attention"]), slots[..., None], 1),
                               rtol=1e-6)


def test_field_errors(rng):
    x = random_batch(rng, 1, 4, 10, 4)
    for fields, message in [
        ([dict(name="category", vocabulary=5)], "BehaviorField.name: 'category' must be an identifier other than "
                                                "item, category, position"),
        ([dict(name="2x", vocabulary=5)], "BehaviorField.name: '2x' must be an identifier"),
        ([dict(name="brand", vocabulary=1)], "BehaviorField 'brand': vocabulary must be >= 2"),
        ([dict(name="brand", vocabulary=5), dict(name="brand", vocabulary=6)], "BehaviorEmbedding: a field is "
                                                                               "named twice: ['brand', 'brand']"),
    ]:
        with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
            BehaviorEmbedding(10, 4, 3, fields=fields)
    with pytest.raises(ValueError, match=r"^BehaviorEmbedding: coupling='shared' shares tables between attention and "
                                         r"representation, so field 'brand''s attention width 2 must equal"):
        BehaviorEmbedding(10, 4, 3, coupling="shared", fields=[dict(name="brand", vocabulary=5,
                                                                    attention_embedding_dim=2)])
    layer = BehaviorEmbedding(10, 4, 3, num_positions=10, fields=[dict(name="brand", vocabulary=5)])
    layer.build()
    with pytest.raises(ValueError, match=r"^BehaviorEmbedding: field 'brand' needs history_fields\['brand'\] \(the "
                                         r"hist_brand input\)"):
        layer.lookup(x["target_item"], x["target_category"], x["hist_items"], x["hist_categories"])
