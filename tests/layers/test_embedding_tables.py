"""dare_tf.layers.embedding_tables: the tables a BehaviorEmbedding holds, their widths
and bytes, per coupling (the layer's variables against them: tests/layers/test_embedding.py)."""

import keras
import numpy as np
import pytest

from dare_tf.layers.behavior_fields import BehaviorField
from dare_tf.layers import BehaviorEmbedding
from dare_tf.layers.embedding_tables import TableLayout, take_rows


def _layout(coupling, att=(4, 2), fields=()):
    return TableLayout(100, 10, 8, 6, *att, 50, coupling, True, fields)


@pytest.mark.parametrize("coupling, sets", [
    ("shared", {"shared"}), ("projection", {"shared"}), ("decoupled", {"attention", "representation"}),
    ("four", {"target_attention", "history_attention", "target_representation", "history_representation"})])
def test_each_coupling_reads_its_table_sets(coupling, sets):
    layout = _layout(coupling, (None, None) if coupling in ("shared", "projection") else (4, 2))
    assert set(layout.table_of_role.values()) == sets


def test_widths_and_bytes_against_a_count_by_hand():
    brand = BehaviorField("brand", 30, embedding_dim=3, attention_embedding_dim=5)
    layout = _layout("decoupled", fields=[brand])
    assert layout.order() == ("item", "category", "brand", "position")
    assert layout.width("attention", "item") == 4 and layout.width("attention", "position") == 2
    assert layout.width("representation", "brand") == 3 and layout.width("attention", "brand") == 5
    assert layout.output_widths() == (2 * 4 + 2 + 5, 2 * 8 + 6 + 3)
    attention = 100 * 4 + 10 * 4 + 30 * 5 + 50 * 2
    representation = 100 * 8 + 10 * 8 + 30 * 3 + 50 * 6
    assert layout.table_bytes() == 4 * (attention + representation)
    assert layout.table_bytes("bfloat16") == 2 * (attention + representation)


@pytest.mark.parametrize("args, message", [
    (("coupled", (4, 2)), "BehaviorEmbedding: coupling='coupled' is not one of"),
    (("shared", (4, 2)), "BehaviorEmbedding: coupling='shared' shares tables between attention and representation, "
                         "so attention dims (4, 2) must equal the representation dims (8, 6)"),
])
def test_refusals(args, message):
    with pytest.raises(ValueError) as error:
        _layout(*args)
    assert str(error.value).startswith(message)


def test_tables_over_the_available_memory_are_refused(monkeypatch):
    from dare_tf.layers import embedding_tables

    monkeypatch.setattr(embedding_tables, "_available_memory", lambda: 1000)
    with pytest.raises(ValueError, match=r"^BehaviorEmbedding: the embedding tables need 0\.0 GiB \(100 items, 10 "
                                         r"categories, .* more than the 0\.0 GiB of memory available"):
        _layout("decoupled").check_memory("float32")
    monkeypatch.setattr(embedding_tables, "_available_memory", lambda: None)  # (unknown: not refused)
    _layout("decoupled").check_memory("float32")


def test_take_rows_reads_and_casts_rows():
    table = np.arange(12, dtype="float32").reshape(6, 2)
    out = np.asarray(take_rows(table, np.array([[5, 0]]), "float16"))
    assert out.dtype == np.float16 and out.tolist() == [[[10, 11], [0, 1]]]


def test_row_multiple_pads_every_vocabulary_table_with_zero_rows_after_the_same_draw():
    """A model-parallel mesh's even split (issue 66, 3): the item, category and field tables'
    rows rounded up to the multiple, their first rows drawn as without it, the rest zeros; the
    positions unpadded; the argument survives the layer's config."""
    def tables(multiple):
        layer = BehaviorEmbedding(51, 7, embedding_dim=4, position_dim=2, num_positions=9, row_multiple=multiple,
                                  fields=[{"name": "brand", "vocabulary": 5}],
                                  embeddings_initializer=keras.initializers.RandomNormal(0.0, 0.01, seed=3))
        layer.build()
        return layer, {v.path.split("/")[-1]: v.numpy() for v in layer.weights}

    _, one = tables(1)
    layer, four = tables(4)
    assert sorted(four) == sorted(one) and len(one) == 8
    for name, padded in four.items():
        rows = one[name].shape[0]
        expected = rows if "position" in name else -(-rows // 4) * 4
        assert padded.shape == (expected, one[name].shape[1]), name
        np.testing.assert_array_equal(padded[:rows], one[name], err_msg=name)
        assert not padded[rows:].any(), name
    assert BehaviorEmbedding.from_config(layer.get_config()).row_multiple == 4
