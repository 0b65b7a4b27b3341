"""What a behaviour's tables are made of: the couplings of its attention and
representation tables (`COUPLINGS`), its built-in fields and any further
categorical field (`BehaviorField`). Read by `dare_tf.layers.BehaviorEmbedding`
and named by `dare_tf.model.config.ModelConfig`; below both (no Keras)."""

from __future__ import annotations

import dataclasses

from dare_tf._faces import public

# The names a config may give; the layers that read them validate against these.
COUPLINGS = ("shared", "decoupled", "four", "projection")  # dare_tf.layers.BehaviorEmbedding


# Every behaviour's built-in fields (a `BehaviorField` takes another name).
BUILT_IN_FIELDS = ("item", "category", "position")


@public("dare_tf")
@dataclasses.dataclass(frozen=True)
class BehaviorField:
    """A categorical field of every behaviour beside its item and category (a
    brand, a seller, an action type, a time-gap bucket), embedded by tables of
    its own in each of `dare_tf.layers.BehaviorEmbedding`'s table sets: the
    decoupling applies field by field.

    Attributes:
        name: an identifier other than `item`, `category` and `position`.
        vocabulary: rows of its tables, padding row 0 included.
        embedding_dim: its representation width (None: the layer's `embedding_dim`).
        attention_embedding_dim: its attention width (None: the layer's attention
            width); couplings with one set of tables need it equal to the
            representation width.
        history_only: the field has no target value (a time gap, an action
            type): the target's part of it is zeros, so it adds nothing to a
            dot-product attention score or to the target-aware product `v_t * h`,
            and reaches the prediction through the pooled history
            representation `h` (and DIN's activation unit).
    """

    name: str
    vocabulary: int
    embedding_dim: int | None = None
    attention_embedding_dim: int | None = None
    history_only: bool = False

    def __post_init__(self):
        import keyword

        if not isinstance(self.name, str) or not self.name.isidentifier() or keyword.iskeyword(self.name) \
                or self.name in BUILT_IN_FIELDS:
            raise ValueError(f"BehaviorField.name: {self.name!r} must be an identifier other than "
                             f"{', '.join(BUILT_IN_FIELDS)}")
        if not isinstance(self.vocabulary, int) or self.vocabulary < 2:
            raise ValueError(f"BehaviorField {self.name!r}: vocabulary must be >= 2 (padding row 0 plus at least "
                             f"one id), got {self.vocabulary!r}")
        for width in ("embedding_dim", "attention_embedding_dim"):
            value = getattr(self, width)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"BehaviorField {self.name!r}: {width} must be >= 1, got {value!r}")

    def widths(self, attention: int, representation: int) -> tuple[int, int]:
        """Its (attention, representation) widths, the given defaults where it sets none."""
        return (attention if self.attention_embedding_dim is None else self.attention_embedding_dim,
                representation if self.embedding_dim is None else self.embedding_dim)

    @classmethod
    def of(cls, value: "BehaviorField | dict") -> "BehaviorField":
        """A `BehaviorField` from itself or its dict (`dataclasses.asdict`)."""
        return value if isinstance(value, cls) else cls(**value)
