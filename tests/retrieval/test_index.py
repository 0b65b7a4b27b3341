"""The retrieval index: exact top-k against a numpy brute force, the faiss
inverted file's recall@200 on a small clustered catalogue, and its refusals."""

import numpy as np
import pytest

from dare_tf.retrieval.index import ApproximateIndex, ExactIndex, exact_top_k, recall


def catalogue(items=20_000, width=32, clusters=64, seed=0):
    """Vectors around cluster centres (as trained item vectors are), and queries near items."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, width))
    vectors = centres[rng.integers(0, clusters, items)] + 0.5 * rng.normal(size=(items, width))
    queries = vectors[rng.integers(0, items, 50)] + 0.5 * rng.normal(size=(50, width))
    return vectors.astype(np.float32), queries.astype(np.float32)


def test_exact_top_k_is_the_brute_force_top_k():
    vectors, queries = catalogue(items=3_000)
    scores = queries @ vectors.T
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :200]
    found = exact_top_k(vectors, queries, 200)
    np.testing.assert_allclose(np.take_along_axis(scores, found, 1), np.take_along_axis(scores, expected, 1),
                               rtol=1e-5)
    assert recall(found, expected) > 0.999
    index = ExactIndex(vectors)  # (built once, asked many times)
    np.testing.assert_array_equal(index.top_k(queries, 200), found)
    np.testing.assert_array_equal(index.top_k(queries[:1], 5), found[:1, :5])


def test_the_approximate_index_finds_at_least_95_percent_of_the_exact_top_200():
    vectors, queries = catalogue()
    index = ApproximateIndex(vectors)
    assert index.lists == 282 and index.probes == 64  # 2 sqrt(20,000) lists
    found, truth = index.top_k(queries, 200), exact_top_k(vectors, queries, 200)
    assert found.shape == (50, 200)
    assert recall(found, truth) >= 0.95
    # Scanning fewer lists finds less: the recall is a property of the probes, not a given.
    few = ApproximateIndex(vectors, probes=1)
    assert recall(few.top_k(queries, 200), truth) < 0.9
    # calibrate: the probes doubled until a sample of queries reaches the target
    reached = few.calibrate(queries[:25], 200, target_recall=0.95)
    assert reached >= 0.95 and few.probes in (2, 4, 8, 16, 32, 64, 128, 256, 282)
    assert recall(few.top_k(queries[:25], 200), truth[:25]) == reached
    half = ApproximateIndex(vectors, probes=few.probes // 2)
    assert recall(half.top_k(queries[:25], 200), truth[:25]) < 0.95  # (the fewest probes that reach it)


def test_the_index_refuses_bad_vectors_and_queries():
    vectors, queries = catalogue(items=1_000)
    with pytest.raises(ValueError, match=r"^queries: expected a \[n, 32\] matrix, got shape \(50, 31\)$"):
        ApproximateIndex(vectors).top_k(queries[:, :31], 10)
    vectors[3, 4] = np.nan
    with pytest.raises(ValueError, match="^vectors: holds a NaN or an infinity$"):
        ApproximateIndex(vectors)
    with pytest.raises(ValueError, match=r"^lists=2000: must be in \[1, 1000\] \(the items\)$"):
        ApproximateIndex(catalogue(items=1_000)[0], lists=2000)
