"""dare_tf.serving.encoding: the request tensors and the answers, without a server
(the transports that carry them: tests/serving/test_client.py, tests/export/test_rank.py)."""

import numpy as np
import pytest

from dare_tf.serving.encoding import (explained_behaviours, format_explanation, in_own_history, pad_histories,
                                      rank_results, rank_tensors, request_tensors, row_errors)


def test_histories_are_right_aligned_behind_the_width_column():
    assert pad_histories([[1, 2, 3], [4]]).tolist() == [[-4, 1, 2, 3], [-4, 0, 0, 4]]
    assert pad_histories([["a"], []]).tolist() == [["-2", "a"], ["-2", ""]]


def test_rank_tensors_left_align_each_users_lists_with_their_lengths():
    out = rank_tensors([[1, 2], [3]], [[5, 6], [7]], [[9], [10, 11]], [[8], [8, 8]],
                       {"candidate_brand": [[1], [2, 3]], "hist_brand": [[4, 4], [5]]})
    assert out["hist_items"].tolist() == [[-3, 1, 2], [-3, 3, 0]]
    assert out["hist_length"].tolist() == [2, 1] and out["candidate_count"].tolist() == [1, 2]
    assert out["candidate_items"].tolist() == [[-3, 9, 0], [-3, 10, 11]]
    assert out["candidate_brand"].tolist() == [[-3, 1, 0], [-3, 2, 3]]
    assert out["hist_brand"].tolist() == [[-3, 4, 4], [-3, 5, 0]]


@pytest.mark.parametrize("args, fields, message", [
    (([[1]], [[1], [2]], [[3]], [[3]]), None,
     "rank: one history and one candidate list per user; got 1 hist_items, 2 hist_categories, 1 candidate_items "
     "and 1 candidate_categories"),
    (([[1, 2]], [[1]], [[3]], [[3]]), None, "rank: user 0 has 2 hist_items but 1 hist_categories"),
    (([[1]], [[1]], [[3]], [[3]]), {"candidate_brand": [[1, 2]]}, "rank: user 0 has 1 candidate_items but 2 "
                                                                   "candidate_brand"),
    (([[1]], [[1]], [[3]], [[3]]), {"target_brand": [1]}, "rank: fields['target_brand']: expected hist_<field> or "
                                                          "candidate_<field> with one row per user (1)"),
    (([[1]], [[1]], [[3]], [[3]]), {"brand": [[1]]}, "fields: 'brand' is not a field input (hist_<field>, "
                                                     "target_<field> or candidate_<field>)"),
])
def test_rank_tensors_refuse_in_one_line(args, fields, message):
    with pytest.raises(ValueError) as error:
        rank_tensors(*args, fields)
    assert str(error.value) == message


def test_request_tensors_with_string_ids_and_fields():
    out = request_tensors([1], [2], [["a", "b"]], [["c", "d"]], {"hist_brand": [["x", "y"]], "target_brand": ["z"]})
    assert out["hist_items"].tolist() == [["-3", "a", "b"]] and out["target_brand"].tolist() == ["z"]
    assert out["hist_brand"].tolist() == [["-3", "x", "y"]]
    with pytest.raises(ValueError, match=r"^fields\['hist_brand'\]: one list per history, as long as it \(row 0: "
                                         r"1 values for 2 hist_items\)$"):
        request_tensors([1], [2], [[1, 2]], [[1, 1]], {"hist_brand": [[1]]})


def test_answers_are_cut_to_each_users_candidates_and_refusals_name_the_row():
    inputs = {"candidate_count": np.array([1, 2])}
    answer = {"probability": np.array([[0.5, 0.0], [0.1, 0.2]]), "error": np.array([b"", b""])}
    assert [r["probability"].tolist() for r in rank_results(inputs, answer)] == [[0.5], [0.1, 0.2]]
    with pytest.raises(ValueError, match=r"^rank: row 1 of the request was refused: too long$"):
        row_errors("rank", dict(answer, error=np.array([b"", b"too long"])))


def test_explanations_index_each_users_own_history():
    out = in_own_history({"history_index": np.array([[3, 2, -1]])}, {"hist_items": np.zeros((1, 4))}, [[7, 8]])
    assert out["history_index"].tolist() == [[1, 0, -1]]
    behaviours = explained_behaviours([1, 0, -1], [0.2, 0.7, 0.1], [7, 8], [70, 80])
    assert behaviours == [{"item": 7, "category": 70, "clicks_ago": 2, "weight": 0.7},
                          {"item": 8, "category": 80, "clicks_ago": 1, "weight": 0.2}]
    assert format_explanation(behaviours).splitlines()[2] == "| 1 | 7 | 70 | 2 | 0.7000 |"


def test_histories_in_ranks_layout_give_the_same_inputs_as_their_lists():
    """The history service's `Histories` ([U, T], each row's clicks first) reach `rank`
    as they are laid out: the inputs equal `rank_tensors`' of the same lists."""
    from dare_tf.serving.encoding import candidate_tensors, history_tensors

    items = np.array([[5, 6, 7], [8, 0, 0]])
    categories = np.array([[1, 1, 2], [3, 0, 0]])
    brand = np.array([[4, 4, 9], [2, 0, 0]])
    lengths = np.array([3, 1])
    lists = rank_tensors([[5, 6, 7], [8]], [[1, 1, 2], [3]], [[11], [12, 13]], [[1], [2, 2]],
                         {"hist_brand": [[4, 4, 9], [2]], "candidate_brand": [[7], [7, 8]]})
    laid = {**history_tensors(items, categories, lengths, {"hist_brand": brand}),
            **candidate_tensors([[11], [12, 13]], [[1], [2, 2]], {"candidate_brand": [[7], [7, 8]]})}
    assert sorted(laid) == sorted(lists)
    assert all(laid[k].tolist() == lists[k].tolist() for k in lists)
    empty = history_tensors(np.array([[""]], object), np.array([[""]], object), [0])  # (a string-id store's)
    assert empty["hist_items"].tolist() == [["-2", ""]] and empty["hist_length"].tolist() == [0]
    with pytest.raises(ValueError, match=r"^rank: hist_items \(2, 3\), hist_categories \(2, 3\) and 2 lengths are "
                                         r"not \[U, T\] rows with each row's length \(0\.\.T\)$"):
        history_tensors(items, categories, [4, 1])
    with pytest.raises(ValueError, match=r"^rank: fields\['hist_brand'\]: expected a hist_<field> \(2, 3\) beside "
                                         r"hist_items, got \(2, 2\)$"):
        history_tensors(items, categories, lengths, {"hist_brand": brand[:, :2]})
