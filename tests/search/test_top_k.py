"""Soft (TWIN, DARE) and hard (TWIN-hard) top-K search against brute-force numpy."""

import numpy as np
import pytest

from dare_tf.search import PADDING_SCORE, HardTopKSearch, SoftTopKSearch, scaled_dot_scores


def kept(search, *args):
    out = search(*args)
    return out["positions"], out["scores"], out["valid"]


def numpy_scores(q, k, mask, pos_dim):
    sem = q.shape[-1] - pos_dim
    s = np.einsum("bd,bld->bl", q[:, :sem], k[:, :, :sem]) / np.sqrt(sem)
    if pos_dim:
        s += np.einsum("bd,bld->bl", q[:, sem:], k[:, :, sem:]) / np.sqrt(pos_dim)
    return np.where(mask, s, PADDING_SCORE)


def numpy_soft(q, k, mask, top_k, pos_dim):
    s = numpy_scores(q, k, mask, pos_dim)
    kk = min(top_k, s.shape[1])
    pos = np.stack([np.argsort(-row, kind="stable")[:kk] for row in s])
    return pos, np.take_along_axis(s, pos, 1), np.take_along_axis(mask, pos, 1)


def numpy_hard(q, k, mask, tc, hc, top_k, pos_dim):
    s = numpy_scores(q, k, mask, pos_dim)
    length = s.shape[1]
    kk = min(top_k, length)
    out = []
    for b in range(s.shape[0]):
        same = [j for j in range(length) if mask[b, j] and hc[b, j] == tc[b]]
        chosen = same[::-1][:kk]
        others = [j for j in reversed(range(length)) if j not in same]
        out.append(chosen + others[: kk - len(chosen)])
    pos = np.array(out)
    return pos, np.take_along_axis(s, pos, 1), np.take_along_axis(mask, pos, 1)


def make_inputs(rng, batch, length, width, lengths):
    q = rng.normal(size=(batch, width)).astype(np.float32)
    k = rng.normal(size=(batch, length, width)).astype(np.float32)
    mask = np.arange(length)[None, :] >= (length - np.asarray(lengths))[:, None]
    tc = rng.integers(1, 4, batch)
    hc = np.where(mask, rng.integers(1, 4, (batch, length)), 0)
    return q, k, mask, tc, hc


# Lengths cover full, short (< K), empty and longer-than-K histories.
CASES = [(30, 5, [30, 3, 0, 12, 5, 1]), (4, 10, [4, 0, 2, 1, 3, 4]), (10, 10, [10, 9, 0, 10, 1, 2])]


@pytest.mark.parametrize("length,top_k,lengths", CASES)
@pytest.mark.parametrize("pos_dim", [0, 4])
def test_soft_search_matches_numpy(rng, length, top_k, lengths, pos_dim):
    q, k, mask, _, _ = make_inputs(rng, len(lengths), length, 12, lengths)
    positions, scores, valid = kept(SoftTopKSearch(top_k, pos_dim), q, k, None, mask)
    ref_pos, ref_scores, ref_valid = numpy_soft(q, k, mask, top_k, pos_dim)
    assert positions.shape == (len(lengths), min(top_k, length))
    np.testing.assert_array_equal(np.asarray(valid), ref_valid)
    # Valid slots are retrieved exactly; padded ones only need to be invalid.
    np.testing.assert_array_equal(np.where(ref_valid, positions, -1), np.where(ref_valid, ref_pos, -1))
    np.testing.assert_allclose(np.asarray(scores), ref_scores, rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(np.asarray(scores)))
    # Every real behaviour is retrieved when there are at most K of them.
    for b, n in enumerate(lengths):
        assert np.asarray(valid)[b].sum() == min(n, top_k)


@pytest.mark.parametrize("length,top_k,lengths", CASES)
def test_hard_search_matches_numpy(rng, length, top_k, lengths):
    q, k, mask, tc, hc = make_inputs(rng, len(lengths), length, 8, lengths)
    positions, scores, valid = kept(HardTopKSearch(top_k, 4), q, k, None, mask, tc, hc)
    ref_pos, ref_scores, ref_valid = numpy_hard(q, k, mask, tc, hc, top_k, 4)
    np.testing.assert_array_equal(np.asarray(positions), ref_pos)
    np.testing.assert_array_equal(np.asarray(valid), ref_valid)
    np.testing.assert_allclose(np.asarray(scores), ref_scores, rtol=1e-5, atol=1e-5)


def test_hard_search_prefers_most_recent_same_category():
    # Category 7 at slots 1, 3, 4; K=2 keeps 4 and 3; K=5 widens with 5 then 2.
    hc = np.array([[0, 7, 1, 7, 7, 2]])
    mask = hc > 0
    q, k = np.zeros((1, 4), np.float32), np.zeros((1, 6, 4), np.float32)
    pos2, _, _ = kept(HardTopKSearch(2), q, k, None, mask, np.array([7]), hc)
    pos5, _, valid5 = kept(HardTopKSearch(5), q, k, None, mask, np.array([7]), hc)
    assert np.asarray(pos2).tolist() == [[4, 3]]
    assert np.asarray(pos5).tolist() == [[4, 3, 1, 5, 2]]
    assert np.asarray(valid5).all()


def test_scaled_dot_scores_float32_under_bfloat16_inputs(rng):
    q = rng.normal(size=(2, 6)).astype("float32")
    k = rng.normal(size=(2, 3, 6)).astype("float32")
    import keras

    s = scaled_dot_scores(keras.ops.cast(q, "bfloat16"), keras.ops.cast(k, "bfloat16"), 2)
    assert keras.backend.standardize_dtype(s.dtype) == "float32"


def test_errors():
    with pytest.raises(ValueError, match="^SoftTopKSearch: top_k must be >= 1, got 0$"):
        SoftTopKSearch(0)
    with pytest.raises(ValueError, match="HardTopKSearch: needs target_category and history_categories"):
        HardTopKSearch(2)(np.zeros((1, 4), "float32"), np.zeros((1, 3, 4), "float32"), None, np.ones((1, 3), bool))


def test_a_position_part_as_wide_as_the_attention_vector_is_refused():
    """The search is told the position part's width (the embedding's
    `attention_position_width`); one that leaves no item/category part is an error."""
    from dare_tf.layers.embedding import BehaviorEmbedding

    embedding = BehaviorEmbedding(50, 5, embedding_dim=4, position_dim=6, attention_embedding_dim=2,
                                  attention_position_dim=3, num_positions=11)
    assert embedding.attention_position_width == 3
    assert BehaviorEmbedding(50, 5, embedding_dim=4, position_dim=6, use_position=False).attention_position_width == 0
    query, keys = np.ones((2, 7), "float32"), np.ones((2, 5, 7), "float32")
    message = ("position_dim=7 leaves no item/category part in attention vectors of width 7: give the search its "
               "embedding's attention_position_width")
    with pytest.raises(ValueError) as e:
        scaled_dot_scores(query, keys, 7)
    assert str(e.value) == message
    with pytest.raises(ValueError, match=message):  # (Keras adds the layer's call around it)
        SoftTopKSearch(top_k=2, position_dim=7)(query, keys, keys, np.ones((2, 5), bool))
