"""Representation discriminability (the paper's Section 3.3): how much the
label can be read from clusters of the user representation a model feeds its
prediction head."""

from __future__ import annotations

import numpy as np


def default_cluster_counts(examples: int, low: int = 10, high: int = 1000, count: int = 7) -> list[int]:
    """Log-spaced k from `low` to `high`, capped at a fifth of the examples."""
    high = max(low, min(high, examples // 5))
    return sorted({int(round(k)) for k in np.geomspace(low, high, count)})


def cluster_label_information(representations: np.ndarray, labels: np.ndarray, cluster_counts,
                              seed: int = 0) -> dict[int, float]:
    """For each k: k-means (scikit-learn, one initialisation, seeded) of the
    representations `[N, D]`, then the mutual information (nats) between the
    cluster id and the label. Deterministic for a seed."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import mutual_info_score

    x = np.asarray(representations, np.float64)
    y = np.asarray(labels) > 0.5
    out = {}
    for k in cluster_counts:
        clusters = KMeans(n_clusters=int(k), n_init=1, random_state=seed).fit_predict(x)
        out[int(k)] = float(mutual_info_score(y, clusters))
    return out
