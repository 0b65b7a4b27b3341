"""Negatives drawn for training, like the candidates a ranker will rank.

A prepared dataset's training examples are the paper's: each click with
`--negatives` items drawn by click frequency over the whole catalogue
(`dare_tf.data.preparation.protocol`). A cascade's ranker instead reorders the 200 or so
plausible items its retrieval stage hands it (popular ones, items of the
user's recent categories, the two-tower's nearest), among which telling a
click from a catalogue item does not transfer. `NegativeSampler` draws, for
every training click, negatives from any mixture of:

- `uniform`: any catalogue item, equally likely;
- `popularity`: by click share (the training targets' clicks);
- `category`: items of the clicked item's category, by their clicks + 1
  (every item of the category can be drawn; a category with no other item
  falls back to `popularity`);
- `retrieval`: uniformly among the first N candidates a trained retrieval
  run proposes for the example's history (the same merged sources the
  cascade ranks, `dare_tf.retrieval.training.RetrievalStage` computes them).

A negative never equals its click (it is redrawn). The mixture is written
`SOURCE:COUNT,...` (`uniform:1,retrieval:8`): COUNT negatives of each source
per click, in that order after the click, one group of `1 + sum(COUNT)`
examples sharing a history. Negatives are drawn afresh every epoch, in the
training input pipeline rather than at preparation: the prepared dataset
stays the paper's (Table 1 reproduces from it, its windows are sha256-pinned),
a mixture can change without preparing again, and `retrieval` needs a
retrieval run, which is trained on the prepared dataset.
"""

from __future__ import annotations

import numpy as np

SOURCES = ("uniform", "popularity", "category", "retrieval")
MAX_REDRAW_ROUNDS = 100
# Negatives per click at most, over all sources.
MAX_DRAWN = 100


def parse_negatives(text: str) -> tuple[tuple[str, int], ...]:
    """`"uniform:1,retrieval:8"` -> `(("uniform", 1), ("retrieval", 8))`; `""` -> `()`
    (the prepared dataset's own negatives). Raises `ValueError` naming the part."""
    if not text.strip():
        return ()
    out, seen = [], set()
    for part in text.split(","):
        source, _, count = part.strip().partition(":")
        if source not in SOURCES:
            raise ValueError(f"negatives={text!r}: unknown source {source!r} in {part.strip()!r}; "
                             f"sources: {', '.join(SOURCES)} (written SOURCE:COUNT,...)")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"negatives={text!r}: {part.strip()!r} needs a count >= 1 (SOURCE:COUNT)")
        if source in seen:
            raise ValueError(f"negatives={text!r}: source {source!r} is given twice")
        seen.add(source)
        out.append((source, int(count)))
    if sum(c for _, c in out) > MAX_DRAWN:
        raise ValueError(f"negatives={text!r}: {sum(c for _, c in out)} negatives per click; at most {MAX_DRAWN}")
    return tuple(out)


def format_negatives(sources) -> str:
    """`parse_negatives`'s inverse."""
    return ",".join(f"{s}:{c}" for s, c in sources)


class NegativeSampler:
    """Draws the groups `[click, negatives...]` of a split's clicks.

    Args:
        positives: int columns `[P]` of the clicks (`uid`, `position`,
            `target_item`, `target_category`: a prepared split's positive rows).
        sources: `parse_negatives`'s result (non-empty).
        item_category: category of every dense item id `[num_items]`.
        clicks: each dense item id's clicks as a training target `[num_items]`.
        candidates: `[P, N]` retrieval candidates of each click's history
            (dense ids, best first); needed by `retrieval` only.
    Catalogue items are the dense ids `1 .. num_items - 2` (0 pads, the last
    id is the out-of-vocabulary item).
    """

    def __init__(self, positives: dict, sources, item_category: np.ndarray, clicks: np.ndarray,
                 candidates: np.ndarray | None = None):
        if not sources:
            raise ValueError("NegativeSampler needs at least one source (SOURCE:COUNT)")
        self.positives = {k: np.asarray(v) for k, v in positives.items()}
        self.sources, self.item_category = tuple(sources), np.asarray(item_category, np.int64)
        self.num_items = len(self.item_category)
        if self.num_items < 4:
            raise ValueError(f"a catalogue of {self.num_items - 2} item(s) leaves nothing to draw a negative from")
        catalogue = np.arange(1, self.num_items - 1)
        self.clicks = np.asarray(clicks, np.float64)[: self.num_items]
        self.group = 1 + sum(c for _, c in self.sources)
        count = len(self.positives["target_item"])
        if any(s == "retrieval" for s, _ in self.sources):
            if candidates is None or len(candidates) != count:
                raise ValueError(f"the retrieval source needs a [clicks, N] candidate table for the {count} clicks, "
                                 f"got {None if candidates is None else np.shape(candidates)}")
        self.candidates = candidates
        weights = self.clicks[catalogue]
        self._popularity = np.cumsum(weights) if weights.sum() > 0 else np.cumsum(np.ones(len(catalogue)))
        # Items sorted by category, with cumulative (clicks + 1) weights: one category is a contiguous range.
        self._by_category = catalogue[np.argsort(self.item_category[catalogue], kind="stable")]
        self._category_sorted = self.item_category[self._by_category]
        self._category_cumulative = np.cumsum(self.clicks[self._by_category] + 1.0)

    def __len__(self) -> int:
        return len(self.positives["target_item"])

    def _draw(self, source: str, rows: np.ndarray, n: int, rng) -> np.ndarray:
        """`[len(rows), n]` candidate negatives of one source for the clicks `rows`."""
        size = (len(rows), n)
        if source == "uniform":
            return rng.integers(1, self.num_items - 1, size)
        if source == "popularity":
            cdf = self._popularity
            return 1 + np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
        if source == "retrieval":
            table = self.candidates[rows]
            return np.take_along_axis(table, rng.integers(0, table.shape[1], size), axis=1)
        category = self.item_category[self.positives["target_item"][rows]]
        start = np.searchsorted(self._category_sorted, category)
        end = np.searchsorted(self._category_sorted, category, side="right")
        cum = self._category_cumulative
        low = np.where(start > 0, cum[np.maximum(start - 1, 0)], 0.0)
        high = np.where(end > start, cum[np.maximum(end - 1, 0)], low)
        u = low[:, None] + rng.random(size) * (high - low)[:, None]
        drawn = self._by_category[np.minimum(np.searchsorted(cum, u, side="right"), len(cum) - 1)]
        alone = (end - start) < 2  # no other item of the category
        if alone.any():
            drawn[alone] = self._draw("popularity", rows[alone], n, rng)
        return drawn

    def negatives(self, rng) -> np.ndarray:
        """`[P, group - 1]` negatives of every click, sources in order, none equal to its click."""
        target = self.positives["target_item"].astype(np.int64)
        parts = []
        for source, n in self.sources:
            rows = np.arange(len(target))
            drawn = self._draw(source, rows, n, rng)
            for _ in range(MAX_REDRAW_ROUNDS):
                bad = np.flatnonzero((drawn == target[:, None]).any(axis=1))
                if not len(bad):
                    break
                again = self._draw(source, rows[bad], n, rng)
                drawn[bad] = np.where(drawn[bad] == target[bad][:, None], again, drawn[bad])
            else:
                raise RuntimeError(f"the {source} source drew click {int(target[bad[0]])} itself as its negative "
                                   f"{MAX_REDRAW_ROUNDS} times (it proposes little else)")
            parts.append(drawn)
        return np.concatenate(parts, axis=1)

    def epoch(self, rng) -> dict[str, np.ndarray]:
        """One epoch's example columns (int32): the groups `[click, negatives...]`
        of every click, the groups in a random order, each group contiguous."""
        order = rng.permutation(len(self))
        drawn = self.negatives(rng)[order]
        p = {k: v[order] for k, v in self.positives.items()}
        targets = np.concatenate([p["target_item"][:, None].astype(np.int64), drawn], axis=1)
        categories = self.item_category[targets]
        categories[:, 0] = p["target_category"]
        g = self.group
        return {"uid": np.repeat(p["uid"], g).astype(np.int32),
                "position": np.repeat(p["position"], g).astype(np.int32),
                "target_item": targets.reshape(-1).astype(np.int32),
                "target_category": categories.reshape(-1).astype(np.int32),
                "label": np.tile(np.eye(1, g, dtype=np.int32)[0], len(self))}

    def epochs(self, seed: int, count: int) -> dict[str, np.ndarray]:
        """`count` epochs' columns back to back (epoch e's from the stream `(seed, e)`)."""
        parts = [self.epoch(np.random.default_rng([seed, e])) for e in range(count)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
