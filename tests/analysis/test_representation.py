"""Representation discriminability: chance-adjusted cluster-label information."""

import numpy as np
import pytest

from dare_tf.analysis import representation


def test_cluster_information_is_deterministic_and_finds_separable_labels(rng):
    x = np.concatenate([rng.normal(0, 0.1, (100, 3)), rng.normal(5, 0.1, (100, 3))])
    y = np.repeat([0, 1], 100)
    first = representation.cluster_label_information(x, y, [2, 10], seed=3)
    assert first == representation.cluster_label_information(x, y, [2, 10], seed=3)
    assert first[2] == pytest.approx(1.0)  # two clusters = the two labels
    assert 0.2 < first[10] < 1.0  # more clusters than labels: lower, still far from chance
    ks = representation.default_cluster_counts(4000)
    assert ks[0] == 10 and ks[-1] == 800 and ks == sorted(set(ks))


def test_pure_noise_gives_about_zero_at_every_k_where_plain_mi_grows_with_k(rng):
    from sklearn.cluster import KMeans
    from sklearn.metrics import mutual_info_score

    x, y = rng.normal(size=(1000, 8)), rng.integers(0, 2, 1000)
    ks = representation.default_cluster_counts(1000)  # 10 .. 200: 5 examples per cluster at the top
    adjusted = representation.cluster_label_information(x, y, ks, seed=0)
    assert all(abs(v) < 0.02 for v in adjusted.values()), adjusted
    # The bias the adjustment removes: plain MI of the same clusters rises with k.
    plain = [mutual_info_score(y, KMeans(n_clusters=k, n_init=1, random_state=0).fit_predict(x)) for k in ks]
    assert plain[-1] > 5 * plain[0] and plain[-1] > 0.05
