"""The attention analysis: category-position scores are the search's scores."""

import numpy as np
import pytest

import dare_tf
from dare_tf.analysis import attention
from tests.conftest import random_batch


def test_learned_category_position_scores_are_the_search_scores_without_items(rng):
    model = dare_tf.build_model("dare", 50, 6, max_len=8, top_k=3, seed=0)
    attention_items = model.embedding.tables["attention"]["item"]
    attention_items.assign(np.zeros(attention_items.shape, "float32"))
    x = random_batch(rng, 5, 8, 50, 6, lengths=[8] * 5)
    embedded = model.embeddings(x)
    expected = model.slot_scores(embedded.roles, embedded.ids).numpy()
    for b in range(5):
        for j in (0, 4, 7):
            got = attention.category_position_scores(model, [x["target_category"][b]], [x["hist_categories"][b, j]],
                                                     [8 - j])
            assert got[0, 0, 0] == pytest.approx(expected[b, j], rel=1e-5, abs=1e-7)
