"""How the two-tower retrieval model trains: `RetrievalConfig` (no TensorFlow: the
program's flags are defined from it before TensorFlow loads)."""

from __future__ import annotations

import dataclasses

from dare_tf._faces import public


@public("dare_tf.retrieval")
@dataclasses.dataclass(frozen=True)
class RetrievalConfig:
    """How the two-tower retrieval model trains.

    Attributes:
        embedding_dim: width of each id embedding in both towers.
        output_dim: width of the query and candidate vectors.
        batch_size: positives per batch (the in-batch softmax's negatives).
        learning_rate: Adagrad learning rate.
        epochs: passes over the training split's positives.
        seeds: one run per seed; results report mean and std.
        popularity_correction: correct the in-batch softmax by each
            candidate's sampling probability (its share of training clicks:
            logQ correction), so that the tower does not learn popularity the
            in-batch negatives under-sample.
        uniform_negatives: catalogue items drawn uniformly per training batch as
            extra negatives beside the batch's own positives (mixed negative
            sampling; 0: in-batch negatives only).
        include_seen: keep the items a user already clicked among the
            candidates (by default they are excluded: evaluation, the cascade
            and the export follow the run's setting).
        eval_positives: the validation and test positives the recall is
            measured on, at most (a sample drawn once, seeded: each is scored
            against the whole catalogue, so at 4M items every one of 130k
            positives would take 20 minutes on two cores).
        recent_floor: the least quota the `recent_categories` source gets
            when the quotas are chosen on validation (a multiple of the quota
            grid's 0.25): clicks of a category a user never had then always
            bring that category's items among the candidates, whichever
            source the validation recall favours (0: the validation alone
            decides; docs/two-stage.md measures what the floor costs).
        cascade_candidates: the candidate counts N whose first N merged
            candidates of every train, val and test positive the finished run
            writes (`candidates-N.npz`, `dare_tf.retrieval.candidate_files`) for
            the rankers trained in its cascade (`trainers.train
            --retrieval_run --retrieval_candidates=N`, on either engine; 200 is
            the ranker's default). None by default: each positive is scored
            against the whole catalogue, hours for millions of positives at
            millions of items, which only a cascade's ranker needs. Not part of
            the run's identity: run again with another count, a finished run
            writes its file without training again.
        verbose: 0 silent, 1 Keras progress bar.
    """

    embedding_dim: int = 32
    output_dim: int = 32
    batch_size: int = 512
    learning_rate: float = 0.1
    epochs: int = 10
    seeds: tuple[int, ...] = (0,)
    popularity_correction: bool = True
    uniform_negatives: int = 0
    include_seen: bool = False
    eval_positives: int = 20_000
    recent_floor: float = 0.25
    cascade_candidates: tuple[int, ...] = ()
    verbose: int = 0

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "cascade_candidates", tuple(int(n) for n in self.cascade_candidates))
        if any(n < 1 for n in self.cascade_candidates):
            raise ValueError(f"cascade_candidates={list(self.cascade_candidates)}: each count must be >= 1")
        for name in ("embedding_dim", "output_dim", "batch_size", "epochs", "eval_positives"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.uniform_negatives < 0:
            raise ValueError(f"uniform_negatives={self.uniform_negatives}: must be >= 0")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate}: must be > 0")
        if not self.seeds:
            raise ValueError("seeds: needs at least one seed")
        if not (0 <= self.recent_floor <= 1 and float(self.recent_floor * 4).is_integer()):
            raise ValueError(f"recent_floor={self.recent_floor}: must be 0, 0.25, 0.5, 0.75 or 1 (the quota grid's "
                             "steps)")
