"""One config object describes every model of the family; presets are overrides.

A model variant of the paper (DARE, TWIN, TWIN-hard, ...) is a configuration of
the shared layers, never a separate model class. `ModelConfig` is the only
thing `dare_tf.model.dare_model.DareModel` reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dare_tf._faces import public
from dare_tf.layers.behavior_fields import COUPLINGS, BehaviorField
from dare_tf.search import SCORERS, VARIANTS

# The names a config may give; the layers that read them validate against these.
INITIALIZERS = ("reference", "keras")
AUX_ATTENTIONS = ("all", "retrieved")


@public("dare_tf")
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a long-sequence CTR model of the DARE family.

    Attributes:
        num_items: item vocabulary size, padding row 0 included (dense ids
            1..num_items-1, as `spec.json` states it).
        num_categories: category vocabulary size, padding row 0 included.
        max_len: history length L the model is built for (the trainers'
            `--max_len`; default: the prepared dataset's).
        embedding_dim: item and category representation embedding width.
        position_dim: position ("time") representation embedding width.
        attention_embedding_dim: item and category attention embedding width
            (DARE's inference-acceleration knob); `None` means embedding_dim.
            Only `decoupled` and `four` couplings may set it differently.
        attention_position_dim: position attention embedding width; `None`
            means position_dim.
        num_positions: rows of the position tables (reference: 2000).
        coupling: `shared` (TWIN, DIN: one set of tables), `decoupled` (DARE:
            attention and representation tables), `four` (TWIN-4E), or
            `projection` (TWIN w/ proj.: shared tables and 12 linear maps).
        search: the search stage, a name in `dare_tf.search.VARIANTS`:
            `soft` (top-K by attention score), `hard` (same category, most
            recent K), `none` (attend over the whole history: DIN), `simhash`
            (ETA: top-K by SimHash Hamming distance, then attention), `sdim`
            (SDIM: means of the behaviours in the target's hash buckets, no
            search) or `cluster` (TWIN-V2: search and attention over clusters
            of the history, log size added to the scores). Each is a
            `BehaviorSearch` subclass that reads the fields it needs.
        scorer: `dot` (scaled dot product, semantic and position parts
            scaled separately) or `din` (DIN's learnable activation unit).
        top_k: K, behaviours (clusters for `cluster`) kept by the search stage.
        hash_bits: `simhash`: signature bits; `sdim`: bits per hash function.
        num_hashes: `sdim`: hash functions.
        cluster_window: `cluster`: behaviours per time window, within which
            one category forms one cluster.
        use_position: embed position ids (DIN does not).
        target_aware: feed the target-aware representation v_t * h.
        use_history_mean: also feed the mean history representation (and its
            product with v_t); off in the published runs.
        use_aux_loss: add the auxiliary head's cross entropy to the loss.
        aux_attention: `all`: the auxiliary head sees attention over every
            non-padded slot, as the reference code computes it; `retrieved`:
            it sees the same top-K pooling as the main head.
        mlp_units: hidden widths of the main prediction MLP.
        aux_mlp_units: hidden widths of the auxiliary MLP.
        din_units: hidden width of DIN's activation unit.
        prelu_init: initial PReLU slope where `initializer` is `keras`.
        l2: L2 penalty on all non-bias, non-embedding weights.
        initializer: `reference`: every non-bias parameter ~ N(0, 0.01) and
            biases as PyTorch initialises them (the paper's code); `keras`: Keras
            defaults for dense layers, embeddings ~ N(0, 0.01).
        synchronized_batch_norm: BatchNorm statistics over the global batch
            across replicas (set by the trainers under a distribution
            strategy, so N replicas train like one process).
        fields: further categorical fields of every behaviour
            (`BehaviorField`s, or their dicts): each has tables of its own in
            every table set (DARE: its attention and representation widths
            apart), its part between the category's and the position's in
            every vector, and the inputs `hist_<name>` (and `target_<name>`,
            `candidate_<name>` in `rank`, unless history-only).
        table_row_multiple: the item, category and field tables' rows rounded
            up to a multiple of this (set by the JAX engine's model-parallel
            placement to its shards; the vocabularies stay the dataset's, the
            padded rows are zeros never looked up).
    """

    num_items: int
    num_categories: int
    max_len: int = 200
    embedding_dim: int = 16
    position_dim: int = 16
    attention_embedding_dim: int | None = None
    attention_position_dim: int | None = None
    num_positions: int = 2000
    coupling: str = "decoupled"
    search: str = "soft"
    scorer: str = "dot"
    top_k: int = 20
    hash_bits: int = 32
    num_hashes: int = 8
    cluster_window: int = 16
    use_position: bool = True
    target_aware: bool = True
    use_history_mean: bool = False
    use_aux_loss: bool = True
    aux_attention: str = "all"
    mlp_units: tuple[int, ...] = (200, 80)
    aux_mlp_units: tuple[int, ...] = (200,)
    din_units: int = 36
    prelu_init: float = 0.1
    l2: float = 1e-6
    initializer: str = "reference"
    synchronized_batch_norm: bool = False
    fields: tuple[BehaviorField, ...] = ()
    table_row_multiple: int = 1

    def __post_init__(self):
        # Tuples survive JSON round trips as lists; normalise them back.
        object.__setattr__(self, "mlp_units", tuple(self.mlp_units))
        object.__setattr__(self, "aux_mlp_units", tuple(self.aux_mlp_units))
        try:
            object.__setattr__(self, "fields", tuple(BehaviorField.of(f) for f in self.fields))
        except (TypeError, ValueError) as e:
            raise ValueError(f"ModelConfig.fields: {e}") from None
        self.validate()

    def field_widths(self) -> dict[str, tuple[int, int]]:
        """Each field's (attention, representation) width."""
        return {f.name: f.widths(self.attention_dim, self.embedding_dim) for f in self.fields}

    @property
    def attention_dim(self) -> int:
        if self.attention_embedding_dim is None:
            return self.embedding_dim
        return self.attention_embedding_dim

    @property
    def attention_pos_dim(self) -> int:
        if not self.use_position:
            return 0
        if self.attention_position_dim is None:
            return self.position_dim
        return self.attention_position_dim

    @property
    def representation_pos_dim(self) -> int:
        return self.position_dim if self.use_position else 0

    @property
    def representation_width(self) -> int:
        """Width of v_t and of every history representation vector."""
        return 2 * self.embedding_dim + sum(r for _, r in self.field_widths().values()) + self.representation_pos_dim

    @property
    def attention_width(self) -> int:
        return 2 * self.attention_dim + sum(a for a, _ in self.field_widths().values()) + self.attention_pos_dim

    def validate(self) -> None:
        def check(ok, field, message):
            if not ok:
                raise ValueError(f"ModelConfig.{field}: {message}")

        check(self.coupling in COUPLINGS, "coupling", f"{self.coupling!r} is not one of {COUPLINGS}")
        check(self.search in VARIANTS, "search", f"{self.search!r} is not one of {tuple(VARIANTS)}")
        check(self.scorer in SCORERS, "scorer", f"{self.scorer!r} is not one of {SCORERS}")
        check(self.initializer in INITIALIZERS, "initializer",
              f"{self.initializer!r} is not one of {INITIALIZERS}")
        check(self.aux_attention in AUX_ATTENTIONS, "aux_attention",
              f"{self.aux_attention!r} is not one of {AUX_ATTENTIONS}")
        for name in ("num_items", "num_categories"):
            check(getattr(self, name) >= 2, name,
                  f"must be >= 2 (padding row 0 plus at least one id), got {getattr(self, name)}")
        for name in ("max_len", "embedding_dim", "top_k", "hash_bits", "num_hashes", "cluster_window",
                     "table_row_multiple"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.attention_dim >= 1, "attention_embedding_dim", f"must be >= 1, got {self.attention_dim}")
        if self.use_position:
            check(self.position_dim >= 1, "position_dim", "must be >= 1 when use_position is on")
            check(self.attention_pos_dim >= 1, "attention_position_dim",
                  "must be >= 1 when use_position is on")
            check(self.max_len < self.num_positions, "num_positions",
                  f"position ids run 0..max_len={self.max_len}, so num_positions must exceed "
                  f"max_len; got {self.num_positions}")
        if self.coupling in ("shared", "projection"):
            check(self.attention_dim == self.embedding_dim
                  and self.attention_pos_dim == self.representation_pos_dim,
                  "attention_embedding_dim",
                  f"coupling={self.coupling!r} uses one set of tables, so attention dims must "
                  "equal the representation dims; use coupling='decoupled' (DARE) to set them apart")
        check(not (self.scorer == "din" and self.coupling != "shared"), "scorer",
              "the DIN activation unit reads one set of tables; use coupling='shared'")
        names = [f.name for f in self.fields]
        check(len(set(names)) == len(names), "fields", f"a field is named twice: {names}")
        for name, (attention, representation) in self.field_widths().items():
            check(self.coupling not in ("shared", "projection") or attention == representation, "fields",
                  f"coupling={self.coupling!r} uses one set of tables, so field {name!r}'s attention width "
                  f"{attention} must equal its representation width {representation}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mlp_units"] = list(self.mlp_units)
        d["aux_mlp_units"] = list(self.aux_mlp_units)
        d["fields"] = [dataclasses.asdict(f) for f in self.fields]
        if not self.fields:  # (a config without fields is recorded as before they existed)
            del d["fields"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**d)
