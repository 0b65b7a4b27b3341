"""Representation discriminability (the paper's Section 3.3): how much the
label can be read from clusters of the user representation a model feeds its
prediction head.

The measure is the adjusted mutual information (AMI; Vinh, Epps and Bailey,
2010; scikit-learn's `adjusted_mutual_info_score`) between the k-means
cluster and the label. Plain mutual information grows with k whatever the
representation (with 5 examples per cluster, clusters of noise "explain" the
label), so its maximum over a k sweep is always the largest k and measures
the estimator's bias; AMI subtracts the MI that k random clusters of the same
sizes would reach, so it is about 0 for clusters unrelated to the label at
every k, and comparable across k.
"""

from __future__ import annotations

import numpy as np

from dare_tf._faces import public

ESTIMATOR = "adjusted mutual information (AMI, chance-corrected) between k-means clusters and the label"


def default_cluster_counts(examples: int, low: int = 10, high: int = 1000, count: int = 7) -> list[int]:
    """Log-spaced k from `low` to `high`, capped at a fifth of the examples."""
    high = max(low, min(high, examples // 5))
    return sorted({int(round(k)) for k in np.geomspace(low, high, count)})


@public("dare_tf.analysis")
def cluster_label_information(representations: np.ndarray, labels: np.ndarray, cluster_counts,
                              seed: int = 0) -> dict[int, float]:
    """For each k: k-means (scikit-learn, one initialisation, seeded) of the
    representations `[N, D]`, then the adjusted mutual information between the
    cluster id and the label (`ESTIMATOR`). Deterministic for a seed."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_mutual_info_score

    x = np.asarray(representations, np.float64)
    y = np.asarray(labels) > 0.5
    out = {}
    for k in cluster_counts:
        clusters = KMeans(n_clusters=int(k), n_init=1, random_state=seed).fit_predict(x)
        out[int(k)] = float(adjusted_mutual_info_score(y, clusters))
    return out
