"""Attention accuracy: the ground-truth correlation of behaviours with the label
against what each model's attention learned (the paper's Section 3 / Figure 2).

Ground truth: for a target category `t`, a behaviour category `c` and a
target-relative position `p` (1 = the most recent behaviour), the mutual
information (bits) between the label and the indicator "the history holds a
behaviour of category `c` at position `p`", estimated from counts over a
split's examples. Learned: the score a model's search stage gives a behaviour
of category `c` at position `p` for a target of category `t`, from its
attention embeddings with the item part left out (as the paper's analysis
does).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dare_tf._faces import public

# Counts below this are replaced by it before the logarithms (the paper's analysis
# uses 1e-5 for a (t, c, p) cell never observed).
MISSING_COUNT = 1e-5


@public("dare_tf.analysis")
@dataclasses.dataclass
class CooccurrenceCounts:
    """Positive and negative example counts per (target category, behaviour
    category, position), stored sparsely: `keys` (sorted, `(t * C + c) * P + p`
    with `P = max_len + 1`) with `positives` and `negatives`; and per target
    category, `target_positives` and `target_negatives` `[C]`."""

    keys: np.ndarray
    positives: np.ndarray
    negatives: np.ndarray
    target_positives: np.ndarray
    target_negatives: np.ndarray
    num_categories: int
    max_len: int

    @classmethod
    def from_examples(cls, target_categories, history_categories, labels, num_categories: int,
                      chunk: int = 1 << 17):
        """Counts over examples: `target_categories` `[N]`, `history_categories`
        `[N, L]` (0 = padding, most recent last), `labels` `[N]` in {0, 1}.
        Vectorised: the examples in target-category order, one `np.unique` over
        the (key, label) pairs of about `chunk` examples at a time, each chunk
        whole target categories (so the chunks' keys are disjoint and ascending,
        and memory beyond the result stays bounded)."""
        tc = np.asarray(target_categories, np.int64)
        y = np.asarray(labels) > 0.5
        history_categories = np.asarray(history_categories)
        n, length = history_categories.shape
        positions = np.arange(length, 0, -1, dtype=np.int64)
        order = np.argsort(tc, kind="stable")
        ordered = tc[order]
        keys, positives, negatives = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        start = 0
        while start < n:
            end = int(np.searchsorted(ordered, ordered[min(start + chunk, n) - 1], side="right"))
            rows = order[start:end]
            hc = np.asarray(history_categories[rows], np.int64)
            real = hc > 0
            cell = (tc[rows, None] * num_categories + hc) * (length + 1) + positions
            # The label as the lowest bit: one sort separates positives and negatives.
            labelled, counts = np.unique((cell * 2 + y[rows, None])[real], return_counts=True)
            unique, inverse = np.unique(labelled // 2, return_inverse=True)
            keys.append(unique)
            positives.append(np.bincount(inverse, weights=counts * (labelled % 2), minlength=len(unique)))
            negatives.append(np.bincount(inverse, weights=counts * (1 - labelled % 2), minlength=len(unique)))
            start = end
        return cls(np.concatenate(keys), np.concatenate(positives).astype(np.int64),
                   np.concatenate(negatives).astype(np.int64),
                   np.bincount(tc[y], minlength=num_categories).astype(np.int64),
                   np.bincount(tc[~y], minlength=num_categories).astype(np.int64), num_categories, length)

    def lookup(self, target, category, position) -> tuple[np.ndarray, np.ndarray]:
        """`(positives, negatives)` of broadcastable index arrays; 0 where unseen."""
        key = (np.asarray(target, np.int64) * self.num_categories + np.asarray(category, np.int64)) \
            * (self.max_len + 1) + np.asarray(position, np.int64)
        at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        found = self.keys[at] == key
        return np.where(found, self.positives[at], 0), np.where(found, self.negatives[at], 0)

    def mutual_information(self, target, category, position) -> np.ndarray:
        """MI (bits) between the label and "category at position present", given
        the target category, for broadcastable index arrays."""
        x_pos, x_neg = self.lookup(target, category, position)
        target = np.asarray(target, np.int64)
        return mutual_information(x_pos, x_neg, self.target_positives[target], self.target_negatives[target])

    def target_examples(self) -> np.ndarray:
        """Examples per target category `[C]`."""
        return self.target_positives + self.target_negatives


@public("dare_tf.analysis")
def mutual_information(x_pos, x_neg, t_pos, t_neg) -> np.ndarray:
    """MI (bits) of a binary feature and the binary label from the counts of
    examples with the feature (`x_pos` positives, `x_neg` negatives) among
    `t_pos` positives and `t_neg` negatives; unseen cells count `MISSING_COUNT`."""
    x_pos = np.maximum(np.asarray(x_pos, np.float64), MISSING_COUNT)
    x_neg = np.maximum(np.asarray(x_neg, np.float64), MISSING_COUNT)
    t_pos = np.asarray(t_pos, np.float64)
    t_neg = np.asarray(t_neg, np.float64)
    total = t_pos + t_neg
    cells = [  # (joint count, feature marginal, label marginal)
        (x_pos, x_pos + x_neg, t_pos),
        (x_neg, x_pos + x_neg, t_neg),
        (t_pos - x_pos, total - x_pos - x_neg, t_pos),
        (t_neg - x_neg, total - x_pos - x_neg, t_neg),
    ]
    out = np.zeros(np.broadcast(x_pos, t_pos).shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        for joint, feature, label in cells:
            term = joint / total * np.log2(joint * total / (feature * label))
            out = out + np.where((joint > 0) & (feature > 0) & (label > 0), term, 0.0)
    return out


@public("dare_tf.analysis")
def category_position_scores(model, target_categories, behaviour_categories, positions) -> np.ndarray:
    """A model's stage-1 score of a behaviour of each category in
    `behaviour_categories` `[C']` at each position in `positions` `[P]` for a
    target of each category in `target_categories` `[T]`: `[T, C', P]`.

    The model's own attention embeddings and scoring (`DareModel.slot_scores`),
    with every item embedding row replaced by zeros: the category and position
    parts of the score only, as the paper's analysis computes them.
    """
    from keras import ops

    from dare_tf.model.inputs import Ids

    emb_layer = model.embedding
    length = model.model_config.max_len
    targets = np.asarray(target_categories, np.int32)
    cats = np.asarray(behaviour_categories, np.int32)
    positions = np.asarray(positions, np.int32)
    if positions.min() < 1 or positions.max() > length:
        raise ValueError(f"positions must lie in 1..{length} (the model's max_len)")
    # One example per target; its history: every (category, position) pair, laid out
    # over as many length-L histories as needed (slot j holds position L - j).
    slots = length - positions  # slot index of each position
    out = np.zeros((len(targets), len(cats), len(positions)), np.float32)
    for ci, c in enumerate(cats):
        hist_c = np.zeros((len(targets), length), np.int32)
        hist_c[:, slots] = c
        hist_i = (hist_c > 0).astype(np.int32)  # any real item id: the mask; its row is zeroed
        ids = Ids(np.ones(len(targets), np.int32), targets, hist_i, hist_c)
        rows = emb_layer.lookup(*ids.lookup_args())
        rows = {k: ops.zeros_like(v) if k.endswith("/item") else v for k, v in rows.items()}
        scores = ops.convert_to_numpy(model.slot_scores(emb_layer.combine(rows), ids))
        out[:, ci, :] = scores[:, slots]
    return out


def rank_correlation(a, b) -> float:
    """Spearman rank correlation of two arrays (flattened)."""
    from scipy.stats import spearmanr

    value = spearmanr(np.ravel(a), np.ravel(b)).statistic
    return float(value) if np.isfinite(value) else float("nan")
