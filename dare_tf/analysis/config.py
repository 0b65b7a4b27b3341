"""What the analysis suite computes: `AnalysisConfig` (no TensorFlow: a program's flags are
defined from it before TensorFlow loads)."""

from __future__ import annotations

import dataclasses

from dare_tf._faces import public, public_names

ANALYSES = ("attention", "retrieval", "gradients", "representation", "convergence", "dimensions")


@public("dare_tf.analysis")
@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    """What the analyses compute.

    Attributes:
        seed: seed of sampling, k-means and the models the suite trains.
        top_categories: the most frequent categories (in the training split)
            used as target and behaviour categories of the attention maps.
        heatmap_targets: target categories drawn in the attention figure.
        positions: target-relative positions (1 = most recent) in the maps.
        min_target_examples: retrieval NDCG uses test examples whose target
            category has at least this many training examples (the paper: 700
            on the full Taobao log), so that the ground truth is estimated.
        max_examples: test examples (the first ones) used by retrieval and
            representation analyses.
        kmeans_examples: test examples clustered (a seeded sample).
        cluster_counts: k of the k-means sweep (empty: 7 log-spaced values
            from 10 to 1000, capped at a fifth of the examples).
        gradient_presets: presets trained with the gradient split (the
            shared-embedding one first: its numbers are the headline).
        gradient_steps: training steps of each gradient run (None: a full run,
            one epoch of the training split at `batch_size`).
        gradient_samples: gradient samples, at equal fractions of that run
            (its first and last step included).
        batch_size: batch size of the suite's own training.
        learning_rate: learning rate of the suite's own training.
        attention_dims: DARE attention widths of the dimension cut (when no
            runs are given for it, the suite trains them).
        dimension_epochs: epochs of each dimension run the suite trains.
        timing_batch: examples per timed search-stage call.
    """

    seed: int = 0
    top_categories: int = 10
    heatmap_targets: int = 3
    positions: int = 10
    min_target_examples: int = 50
    max_examples: int = 20_000
    kmeans_examples: int = 4000
    cluster_counts: tuple[int, ...] = ()
    gradient_presets: tuple[str, ...] = ("twin", "dare")
    gradient_steps: int | None = None
    gradient_samples: int = 21
    batch_size: int = 256
    learning_rate: float = 0.005
    attention_dims: tuple[int, ...] = (64, 32, 16, 8)
    dimension_epochs: int = 1
    timing_batch: int = 1024

    def __post_init__(self):
        for name in ("top_categories", "heatmap_targets", "positions", "max_examples", "kmeans_examples",
                     "gradient_samples", "batch_size", "dimension_epochs", "timing_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.gradient_steps is not None and self.gradient_steps < 1:
            raise ValueError(f"gradient_steps={self.gradient_steps}: must be >= 1")
        if self.min_target_examples < 0:
            raise ValueError(f"min_target_examples={self.min_target_examples}: must be >= 0")
        if any(d < 1 for d in self.attention_dims) or any(k < 2 for k in self.cluster_counts):
            raise ValueError("attention_dims must be >= 1 and cluster_counts >= 2")


public_names("dare_tf.analysis", "ANALYSES")
