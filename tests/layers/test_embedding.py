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
