"""Representation discriminability: cluster-label information."""

import numpy as np
import pytest

from dare_tf.analysis import representation


def test_cluster_information_is_deterministic_and_finds_separable_labels(rng):
    x = np.concatenate([rng.normal(0, 0.1, (100, 3)), rng.normal(5, 0.1, (100, 3))])
    y = np.repeat([0, 1], 100)
    first = representation.cluster_label_information(x, y, [2, 10], seed=3)
    assert first == representation.cluster_label_information(x, y, [2, 10], seed=3)
    assert first[2] == pytest.approx(np.log(2), rel=1e-6)  # two clusters = the two labels
    ks = representation.default_cluster_counts(4000)
    assert ks[0] == 10 and ks[-1] == 800 and ks == sorted(set(ks))
