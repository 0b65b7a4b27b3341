"""Top-k of a catalogue's candidate vectors by inner product, exact or through an
approximate index (faiss), for catalogues of millions of items in process.

    index = ApproximateIndex(vectors)            # [items, d] float32
    slots = index.top_k(queries, 200)            # [queries, 200] rows of `vectors`
    recall(slots, exact_top_k(vectors, queries, 200))

`ApproximateIndex` is faiss's inverted file (`IndexIVFFlat`, inner product):
the vectors are clustered into `lists` lists (k-means on a sample), and a
query scans the `probes` lists whose centroids score highest, about
`probes / lists` of the catalogue. `calibrate(sample_queries, k)` doubles the
probes until a sample of queries finds a target share (0.95) of their exact
top-k (benchmarks/bench_scale.py, `retrieval`, measures the time and the
recall@200 at 4.16M items).
The exported retrieval model (`dare_tf.export.retrieval`) scores every item
exactly, in the SavedModel that TF Serving runs; this index is for a
retrieval stage served in process.
"""

from __future__ import annotations

import numpy as np

LISTS_PER_SQRT_ITEM = 2  # lists = 2 sqrt(items), faiss's usual 1x-16x range
TRAIN_POINTS_PER_LIST = 64  # k-means sample: 64 vectors a list (faiss warns below 39)
DEFAULT_PROBES = 64


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("dare_tf.retrieval.index needs faiss: pip install faiss-cpu (or dare-tf[ann])") from None
    return faiss


def _float32(name: str, values, width: int | None = None) -> np.ndarray:
    array = np.ascontiguousarray(values, dtype=np.float32)
    if array.ndim != 2 or (width is not None and array.shape[1] != width):
        raise ValueError(f"{name}: expected a [n, {width or 'd'}] matrix, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: holds a NaN or an infinity")
    return array


class ExactIndex:
    """Every vector of `vectors` (`[items, d]`) scored: `top_k(queries, k)` the rows of
    the `k` highest inner products, best first (faiss's flat index, multi-threaded)."""

    def __init__(self, vectors):
        faiss = _faiss()
        self.vectors = _float32("vectors", vectors)
        self.index = faiss.IndexFlatIP(self.vectors.shape[1])
        self.index.add(self.vectors)

    def top_k(self, queries, k: int) -> np.ndarray:
        if k < 1:
            raise ValueError(f"k={k}: must be >= 1")
        queries = _float32("queries", queries, self.vectors.shape[1])
        return self.index.search(queries, min(k, len(self.vectors)))[1]


def exact_top_k(vectors, queries, k: int) -> np.ndarray:
    """The `k` rows of `vectors` with the highest inner product with each query,
    best first (`[queries, k]`; `ExactIndex`, built for this call)."""
    return ExactIndex(vectors).top_k(queries, k)


class ApproximateIndex:
    """An inverted-file index of `vectors` (`[items, d]`): `top_k(queries, k)` the
    rows of about the `k` highest inner products, best first, scanning `probes`
    of its `lists` lists (default `2 sqrt(items)`)."""

    def __init__(self, vectors, lists: int | None = None, probes: int = DEFAULT_PROBES, seed: int = 0):
        faiss = _faiss()
        vectors = _float32("vectors", vectors)
        items, width = vectors.shape
        self.lists = int(lists or max(1, min(items // TRAIN_POINTS_PER_LIST, LISTS_PER_SQRT_ITEM * np.sqrt(items))))
        if not 1 <= self.lists <= items:
            raise ValueError(f"lists={self.lists}: must be in [1, {items}] (the items)")
        self.probes = min(int(probes), self.lists)
        if self.probes < 1:
            raise ValueError(f"probes={probes}: must be >= 1")
        quantizer = faiss.IndexFlatIP(width)
        self.index = faiss.IndexIVFFlat(quantizer, width, self.lists, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(seed).choice(items, min(items, self.lists * TRAIN_POINTS_PER_LIST),
                                                    replace=False)
        self.index.train(vectors[np.sort(sample)])
        self.index.add(vectors)
        self.index.nprobe = self.probes
        self.items, self.width, self.vectors = items, width, vectors
        self._quantizer = quantizer  # (faiss does not own it)

    def calibrate(self, queries, k: int, target_recall: float = 0.95) -> float:
        """Doubles `probes` (up to every list) until the index finds `target_recall`
        of the exact top-`k` of `queries` (a sample like the ones it will serve);
        returns the recall reached."""
        if not 0 < target_recall <= 1:
            raise ValueError(f"target_recall={target_recall}: must be in (0, 1]")
        truth = exact_top_k(self.vectors, queries, k)
        while True:
            reached = recall(self.top_k(queries, k), truth)
            if reached >= target_recall or self.probes == self.lists:
                return reached
            self.probes = min(2 * self.probes, self.lists)
            self.index.nprobe = self.probes

    @property
    def description(self) -> str:
        return f"faiss IndexIVFFlat, {self.lists} lists, {self.probes} probes"

    def top_k(self, queries, k: int) -> np.ndarray:
        """`[queries, k]` rows of the vectors, best first; -1 where fewer than
        `k` vectors were scanned."""
        if k < 1:
            raise ValueError(f"k={k}: must be >= 1")
        return self.index.search(_float32("queries", queries, self.width), min(k, self.items))[1]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """The share of each row of `truth` found in the same row of `found`, averaged."""
    return float(np.mean([np.isin(t, f).mean() for f, t in zip(found, truth)]))
