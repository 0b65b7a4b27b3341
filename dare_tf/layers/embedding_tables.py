"""The embedding tables of a `BehaviorEmbedding`: which it holds and how wide each
is (`TableLayout`: the table set each role reads under a coupling, each field's
rows and widths, the vectors' widths and the tables' bytes), and how their rows
are read (`take_rows`)."""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from dare_tf.layers.behavior_fields import COUPLINGS, BehaviorField

ROLES = ("target_attention", "history_attention", "target_representation", "history_representation")
ATTENTION_ROLES = ROLES[:2]
# What a forward pass reads before its search when the history representation is
# looked up for the retrieved slots only (`history_at`).
ROLES_BEFORE_SEARCH = ROLES[:3]


def _available_memory() -> int | None:
    """Bytes of memory available to allocate (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _table_of_role(coupling: str) -> dict[str, str]:
    """Role -> the name of the table set it reads: one set (`shared`, `projection`),
    one per attention and representation (`decoupled`), or one per role."""
    if coupling in ("shared", "projection"):
        return {role: "shared" for role in ROLES}
    if coupling == "decoupled":
        return {role: role.split("_")[1] for role in ROLES}
    return {role: role for role in ROLES}


class TableLayout:
    """The tables of a `BehaviorEmbedding` (its arguments, checked in one line each):
    `table_of_role` (role -> table set), `widths` (`attention` and
    `representation`: (item and category width, position width)), each field's
    (attention, representation) widths, and per table set and field its rows
    and width."""

    def __init__(self, num_items: int, num_categories: int, embedding_dim: int, position_dim: int,
                 attention_embedding_dim: int | None, attention_position_dim: int | None, num_positions: int,
                 coupling: str, use_position: bool, fields=()):
        if coupling not in COUPLINGS:
            raise ValueError(f"BehaviorEmbedding: coupling={coupling!r} is not one of {COUPLINGS}")
        att_dim = embedding_dim if attention_embedding_dim is None else attention_embedding_dim
        att_pos = position_dim if attention_position_dim is None else attention_position_dim
        if coupling in ("shared", "projection") and (att_dim, att_pos) != (embedding_dim, position_dim):
            raise ValueError(
                f"BehaviorEmbedding: coupling={coupling!r} shares tables between attention and "
                f"representation, so attention dims ({att_dim}, {att_pos}) must equal the "
                f"representation dims ({embedding_dim}, {position_dim})")
        self.num_items, self.num_categories, self.num_positions = num_items, num_categories, num_positions
        self.use_position = use_position
        self.widths = {"attention": (att_dim, att_pos), "representation": (embedding_dim, position_dim)}
        self.fields = tuple(BehaviorField.of(f) for f in fields)
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"BehaviorEmbedding: a field is named twice: {names}")
        # Field -> (attention width, representation width).
        self.field_widths = {f.name: f.widths(att_dim, embedding_dim) for f in self.fields}
        for name, (attention, representation) in self.field_widths.items():
            if coupling in ("shared", "projection") and attention != representation:
                raise ValueError(f"BehaviorEmbedding: coupling={coupling!r} shares tables between attention and "
                                 f"representation, so field {name!r}'s attention width {attention} must equal its "
                                 f"representation width {representation}")
        self.history_only = {f.name for f in self.fields if f.history_only}
        self.table_of_role = _table_of_role(coupling)

    def width(self, table_set: str, field: str) -> int:
        """The width of `field`'s table in `table_set`."""
        kind = "representation" if table_set == "shared" or "attention" not in table_set else "attention"
        dim, pos_dim = self.widths[kind]
        if field in self.field_widths:
            return self.field_widths[field][0 if "attention" in table_set else 1]
        return pos_dim if field == "position" else dim

    def vocabularies(self) -> dict[str, int]:
        """Rows of each field's tables, in the order the vectors concatenate them."""
        rows = {"item": self.num_items, "category": self.num_categories, **{f.name: f.vocabulary for f in self.fields}}
        return {**rows, "position": self.num_positions} if self.use_position else rows

    def table_rows(self, multiple: int = 1) -> dict[str, tuple[int, int]]:
        """Each field's (vocabulary, rows of its tables): the rows rounded up to a multiple
        of `multiple`, but the position tables' (never sharded)."""
        return {field: (rows, rows if field == "position" else -(-rows // multiple) * multiple)
                for field, rows in self.vocabularies().items()}

    def order(self) -> tuple[str, ...]:
        """The fields in the order the vectors concatenate them (`item`, `category`,
        the further fields, `position`)."""
        return tuple(self.vocabularies())

    def output_widths(self) -> tuple[int, int]:
        """The widths of the attention and of the representation vectors."""
        (ad, ap), (rd, rp) = self.widths["attention"], self.widths["representation"]
        if not self.use_position:
            ap = rp = 0
        return (2 * ad + ap + sum(a for a, _ in self.field_widths.values()),
                2 * rd + rp + sum(r for _, r in self.field_widths.values()))

    def table_bytes(self, variable_dtype: str = "float32") -> int:
        """What the tables will hold, in bytes, as `variable_dtype`."""
        itemsize = 2 if variable_dtype in ("float16", "bfloat16") else 8 if variable_dtype == "float64" else 4
        total = 0
        for table_set in dict.fromkeys(self.table_of_role.values()):
            total += sum(rows * self.width(table_set, field) for field, rows in self.vocabularies().items())
        return total * itemsize

    def check_memory(self, variable_dtype: str) -> None:
        """Refuses, in one line, tables larger than the memory available."""
        needed, available = self.table_bytes(variable_dtype), _available_memory()
        if available is not None and needed > available:
            raise ValueError(
                f"BehaviorEmbedding: the embedding tables need {needed / 2**30:,.1f} GiB ({self.num_items:,} items, "
                f"{self.num_categories:,} categories, widths {self.widths}), more than the "
                f"{available / 2**30:,.1f} GiB of memory available; check the vocabulary sizes (spec.json's "
                "num_items) or shrink the widths")


def padded_initializer(initializer, rows: int, padded: int):
    """`initializer` where `padded == rows`; else its draw of `rows` rows followed by
    zero rows up to `padded` (the rows drawn as without the padding)."""
    if padded == rows:
        return initializer
    return lambda shape, dtype=None: ops.pad(initializer((rows, *shape[1:]), dtype=dtype),
                                             [[0, padded - rows], [0, 0]])


_RECORDING: list[list] = []  # (recorded_lookups) innermost last


@contextlib.contextmanager
def recorded_lookups():
    """While open, every `take_rows` of a table variable appends `(its path, the row
    ids)` to the list it yields: which rows a step reads, for an optimizer that updates
    only those (`dare_tf.training.engines.jax.state`'s lazy Adam; TensorFlow's sparse gradients
    carry them)."""
    _RECORDING.append([])
    try:
        yield _RECORDING[-1]
    finally:
        _RECORDING.pop()


def take_rows(table, rows, dtype=None):
    """Rows `rows` of an embedding table, cast to `dtype`; the table's gradient is
    sparse (the batch's rows only).

    On TensorFlow the rows are read straight from the variable
    (`ResourceGather`), outside any XLA cluster (see `DareModel`): an
    optimizer that updates rows in place (`dare_tf.optimizers.LazyAdam`) puts
    the variable in TensorFlow's copy-on-read mode, in which every dense read
    copies the whole table (~25 ms for a 4M x 16 table). On JAX the gradient
    is `dare_tf.layers.table_gradients`' (on a GPU one scatter of materialized
    cotangents, a small table's spread over copies); other backends use `ops.take`.
    """
    if _RECORDING and isinstance(table, keras.Variable):
        _RECORDING[-1].append((table.path, rows))
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        values = tf.gather(table.value if isinstance(table, keras.Variable) else table, rows)
    elif keras.backend.backend() == "jax":
        from dare_tf.layers import table_gradients

        values = table_gradients.take(ops.convert_to_tensor(table), ops.convert_to_tensor(rows))
    else:
        values = ops.take(table, rows, axis=0)
    # Under a mixed policy the layer computes in a lower precision than the table holds.
    return values if dtype is None else ops.cast(values, dtype)
