"""BehaviorEmbedding: attention and representation embeddings of target and history."""

from __future__ import annotations

import keras
from keras import ops

import dataclasses

from dare_tf.layers.embedding_tables import ROLES, TableLayout, padded_initializer, take_rows
from dare_tf.layers.pooling import gather_user_slots


@keras.saving.register_keras_serializable(package="dare_tf")
class BehaviorEmbedding(keras.layers.Layer):
    """Embeds a target and its behaviour history for attention and for representation.

    Each behaviour (and the target) is `concat(item_emb, category_emb,
    field_emb..., position_emb)`: the `fields` (`dare_tf.model.config.BehaviorField`,
    a brand, a seller, a time-gap bucket) between the category and the
    position, in their order, each with tables of its own in every table set.
    History slot `j` of `L` has position id `L - j` (the most recent slot,
    last, gets 1); the target has position id 0 (the paper's code,
    github.com/thuml/DARE).

    Which tables serve which role is the `coupling`:

    - `shared` (TWIN, DIN): one set of tables for attention and representation.
    - `decoupled` (DARE): an attention set and a representation set; the
      attention widths are free (`attention_embedding_dim`,
      `attention_position_dim`), which shrinks the search stage.
    - `four` (TWIN-4E): attention/representation x target/history sets.
    - `projection` (TWIN w/ proj.): shared tables, then a square linear map
      without bias per field and per role: 12 maps.

    Args:
        num_items: item vocabulary size including padding row 0.
        num_categories: category vocabulary size including padding row 0.
        embedding_dim: representation width of the item and category tables.
        position_dim: representation width of the position table.
        attention_embedding_dim: attention width of item and category tables
            (`decoupled` and `four` only); defaults to `embedding_dim`.
        attention_position_dim: attention width of the position table;
            defaults to `position_dim`.
        num_positions: rows of each position table.
        coupling: one of `shared`, `decoupled`, `four`, `projection`.
        use_position: whether position embeddings are part of each vector.
        fields: further categorical fields of every behaviour
            (`BehaviorField`s or their dicts); a `history_only` field's part
            of the target vectors is zeros.
        embeddings_initializer: initializer of every table.
        row_multiple: every table but the position ones holds its rows rounded
            up to a multiple of this (an even split over a model-parallel
            mesh's `model` axis); the rows past the vocabulary start at zero and
            are never looked up, the others are drawn as without it.
        projection_initializer: initializer of the `projection` maps.
        projection_regularizer: regularizer of the `projection` maps.

    Call arguments:
        target_item, target_category: int tensors `[B]`.
        history_items, history_categories: int tensors `[B, L]`, 0 = padding.
        target_fields: `{name: [B]}` of the fields that are not history-only.
        history_fields: `{name: [B, L]}` of every field.

    Returns:
        A dict with `target_attention` `[B, Da]`, `history_attention`
        `[B, L, Da]`, `target_representation` `[B, Dr]` and
        `history_representation` `[B, L, Dr]`, where
        `Da = 2 * attention_embedding_dim + attention_position_dim` and
        `Dr = 2 * embedding_dim + position_dim`, plus each field's widths.

    Examples:
        >>> layer = BehaviorEmbedding(100, 10, embedding_dim=8, position_dim=4,
        ...                           attention_embedding_dim=4, coupling="decoupled")
        >>> out = layer(ops.array([3]), ops.array([1]),
        ...             ops.array([[0, 5, 7]]), ops.array([[0, 2, 1]]))
        >>> tuple(out["history_attention"].shape), tuple(out["target_representation"].shape)
        ((1, 3, 12), (1, 20))

    References:
        Feng et al., "Long-Sequence Recommendation Models Need Decoupled
        Embeddings", ICLR 2025, https://arxiv.org/abs/2410.02604
    """

    def __init__(
        self,
        num_items: int,
        num_categories: int,
        embedding_dim: int = 16,
        position_dim: int = 16,
        attention_embedding_dim: int | None = None,
        attention_position_dim: int | None = None,
        num_positions: int = 2000,
        coupling: str = "decoupled",
        use_position: bool = True,
        fields=(),
        embeddings_initializer="random_normal",
        projection_initializer="random_normal",
        projection_regularizer=None,
        row_multiple: int = 1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # (checked first: a coupling or widths the layout refuses build no layer)
        self.layout = TableLayout(num_items, num_categories, embedding_dim, position_dim, attention_embedding_dim,
                                  attention_position_dim, num_positions, coupling, use_position, fields)
        self.fields = self.layout.fields
        self.num_items = num_items
        self.num_categories = num_categories
        self.embedding_dim = embedding_dim
        self.position_dim = position_dim
        self.attention_embedding_dim = attention_embedding_dim
        self.attention_position_dim = attention_position_dim
        self.num_positions = num_positions
        self.coupling = coupling
        self.use_position = use_position
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.projection_initializer = keras.initializers.get(projection_initializer)
        self.projection_regularizer = keras.regularizers.get(projection_regularizer)
        if row_multiple < 1:
            raise ValueError(f"BehaviorEmbedding: row_multiple={row_multiple} must be >= 1")
        self.row_multiple = row_multiple

    @property
    def attention_position_width(self) -> int:
        """The width of the position part at the end of every attention vector (0
        without positions): the `position_dim` a search over these vectors scales on
        its own (`dare_tf.search.BehaviorSearch`)."""
        return self.layout.widths["attention"][1] if self.use_position else 0

    def table_bytes(self) -> int:
        """What the tables will hold, in bytes (float32 or the policy's variable dtype)."""
        return self.layout.table_bytes(self.variable_dtype)

    def build(self, *args, **kwargs):
        self.layout.check_memory(self.variable_dtype)
        self.tables: dict[str, dict[str, keras.Variable]] = {}
        for table_set in dict.fromkeys(self.layout.table_of_role.values()):
            self.tables[table_set] = {
                field: self.add_weight(shape=(padded, self.layout.width(table_set, field)),
                                       initializer=padded_initializer(self.embeddings_initializer, rows, padded),
                                       name=f"{table_set}_{field}_embedding")
                for field, (rows, padded) in self.layout.table_rows(self.row_multiple).items()}
        self.projections: dict[str, keras.Variable] = {}
        if self.coupling == "projection":
            for role in ROLES:
                for field in self.layout.order():
                    width = self.layout.width("shared", field)
                    self.projections[f"{role}_{field}"] = self.add_weight(
                        shape=(width, width), initializer=self.projection_initializer,
                        regularizer=self.projection_regularizer,
                        name=f"{role}_{field}_projection")
        self.built = True

    def table_names(self) -> dict[str, str]:
        """Maps each role to the name of the table set that serves it."""
        return dict(self.layout.table_of_role)

    def row_ids(self, target_item, target_category, history_items, history_categories, roles=ROLES,
                history_positions=None, target_fields=None, history_fields=None) -> dict:
        """Which rows `lookup` reads for `roles`: `"{set}/{side}/{field}"` ->
        `(table, ids)`, the table variable and the ids (`[B]` or `[B, L]`)
        gathered from it (a history-only field has no target rows).
        `history_positions` (`[B, K]` position ids) looks up K slots picked
        from a longer history (ids gathered at those slots)."""
        history_items = ops.convert_to_tensor(history_items)
        length = history_items.shape[1]
        if history_positions is not None:
            length = None
        if self.use_position and length is not None and length >= self.num_positions:
            raise ValueError(
                f"BehaviorEmbedding: history length {length} needs position ids up to {length}, "
                f"but the position tables have only num_positions={self.num_positions} rows")
        ids = {
            "target": {"item": target_item, "category": target_category},
            "history": {"item": history_items, "category": history_categories},
        }
        for f in self.fields:
            for side, given, what in (("history", history_fields, "history_fields"),
                                      ("target", target_fields, "target_fields")):
                if side == "target" and f.history_only:
                    continue
                if not given or f.name not in given:
                    raise ValueError(f"BehaviorEmbedding: field {f.name!r} needs {what}[{f.name!r}] (the "
                                     f"{'hist' if side == 'history' else 'target'}_{f.name} input)")
                ids[side][f.name] = given[f.name]
        if self.use_position and history_positions is not None:
            ids["history"]["position"] = ops.cast(history_positions, "int32")
        elif self.use_position:
            # reference.md: slot j of L gets position id L - j; the target gets 0.
            positions = ops.arange(ops.shape(history_items)[1], 0, -1, dtype="int32")
            ids["history"]["position"] = ops.broadcast_to(
                ops.expand_dims(positions, 0), ops.shape(history_items))
            ids["target"]["position"] = ops.zeros_like(ops.convert_to_tensor(target_item), dtype="int32")
        out = {}
        for role in roles:
            table_set, side = self.layout.table_of_role[role], role.split("_")[0]
            for field in self.layout.order():
                if side == "target" and field in self.layout.history_only:
                    continue
                out.setdefault(f"{table_set}/{side}/{field}", (self.tables[table_set][field], ids[side][field]))
        return out

    def lookup(self, target_item, target_category, history_items, history_categories, roles=ROLES,
               history_positions=None, target_fields=None, history_fields=None) -> dict:
        """Table rows of every (table set, side, field) that `roles` read:
        `"{set}/{side}/{field}"` -> `[B, d]` or `[B, L, d]`. Each table is
        gathered once per side, so its gradient stays sparse (rows of the batch
        only). `history_positions`, the fields: see `row_ids`."""
        return {key: take_rows(table, ids, self.compute_dtype)
                for key, (table, ids) in self.row_ids(target_item, target_category, history_items,
                                                      history_categories, roles, history_positions, target_fields,
                                                      history_fields).items()}

    def history_at(self, role, history_items, history_categories, slots, history_fields=None):
        """The `role` (`history_attention` or `history_representation`)
        embeddings of the slots `slots` `[B, K]` of `[B, L]` histories only:
        the ids at those slots looked up (with their position ids L - slot),
        equal to gathering `call`'s `[B, L, D]` output at `slots` without
        computing it (its gradient reaches K rows per example, not L).
        User-major `slots` `[U, N, K]` of `[U, L]` histories give `[U * N, K, D]`."""
        length = ops.shape(history_items)[1]
        slots = ops.cast(slots, "int32")
        if len(slots.shape) == 3:  # user-major
            def at(ids):
                return gather_user_slots(ids, slots)
        else:
            def at(ids):
                return ops.take_along_axis(ids, slots, axis=1)
        items, categories = at(history_items), at(history_categories)
        fields = {name: at(ids) for name, ids in (history_fields or {}).items()}
        slots = ops.reshape(slots, (-1, slots.shape[-1]))
        rows = self.lookup(items[:, 0], categories[:, 0], items, categories, (role,),
                           history_positions=ops.cast(length, "int32") - slots,
                           target_fields={name: ids[:, 0] for name, ids in fields.items()}, history_fields=fields)
        return self.combine(rows, (role,))[role]

    def combine(self, gathered: dict, roles=ROLES) -> dict:
        """The role embeddings (all four, or those in `roles`) from `lookup`'s rows
        (projections applied); `gathered` needs the rows of those roles only."""
        outputs, joined = {}, {}
        for role in roles:
            table_set, side = self.layout.table_of_role[role], role.split("_")[0]
            if not self.projections and (table_set, side) in joined:
                # Shared tables: attention and representation are the same vectors.
                outputs[role] = joined[(table_set, side)]
                continue
            parts = []
            for field in self.layout.order():
                if side == "target" and field in self.layout.history_only:  # no target value: zeros
                    like = gathered[f"{table_set}/{side}/item"][..., :1]
                    parts.append(ops.zeros_like(like) * ops.zeros((self.layout.width(table_set, field),), like.dtype))
                    continue
                vectors = gathered[f"{table_set}/{side}/{field}"]
                if self.projections:
                    vectors = ops.matmul(vectors, self.projections[f"{role}_{field}"])
                parts.append(vectors)
            outputs[role] = joined[(table_set, side)] = ops.concatenate(parts, axis=-1)
        return outputs

    def call(self, target_item, target_category, history_items, history_categories, target_fields=None,
             history_fields=None):
        return self.combine(self.lookup(target_item, target_category, history_items, history_categories,
                                        target_fields=target_fields, history_fields=history_fields))

    def compute_output_spec(self, target_item, target_category, history_items, history_categories,
                            target_fields=None, history_fields=None):
        b, length = history_items.shape[0], history_items.shape[1]
        da, dr = self.layout.output_widths()
        spec = lambda shape: keras.KerasTensor(shape, dtype=self.compute_dtype)  # noqa: E731
        return {
            "target_attention": spec((b, da)),
            "history_attention": spec((b, length, da)),
            "target_representation": spec((b, dr)),
            "history_representation": spec((b, length, dr)),
        }

    def get_config(self):
        config = super().get_config()
        config.update(
            num_items=self.num_items,
            num_categories=self.num_categories,
            embedding_dim=self.embedding_dim,
            position_dim=self.position_dim,
            attention_embedding_dim=self.attention_embedding_dim,
            attention_position_dim=self.attention_position_dim,
            num_positions=self.num_positions,
            coupling=self.coupling,
            use_position=self.use_position,
            fields=[dataclasses.asdict(f) for f in self.fields],
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            projection_initializer=keras.initializers.serialize(self.projection_initializer),
            projection_regularizer=keras.regularizers.serialize(self.projection_regularizer),
            row_multiple=self.row_multiple,
        )
        return config

