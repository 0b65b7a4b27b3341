"""DareModel: every model of the family as one composition of the shared layers.

Backend-neutral: `keras.ops` only. On TensorFlow, how the model is executed
(XLA, sparse table gradients) is `dare_tf.model.execution`'s.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from dare_tf._faces import public, public_names
from dare_tf.model.config import ModelConfig
from dare_tf.data.storage.schema import MODEL_INPUTS as INPUT_KEYS  # noqa: F401 (dare_tf.INPUT_KEYS)
from dare_tf.model.inputs import ExampleEmbeddings, Ids, dummy_inputs, example_ids
from dare_tf.layers import BehaviorEmbedding, PredictionHead, TargetAttentionPooling
from dare_tf.layers.embedding_tables import ROLES, ROLES_BEFORE_SEARCH
from dare_tf.layers.pooling import head_features, target_aware
from dare_tf.search import build_search
from dare_tf.search.base import SearchResult
from dare_tf.model.serving import ServingMixin
from dare_tf.model.training import TrainingMixin, _tensorflow_execution
from dare_tf.model.tasks import ClickTask

# What `call(training=True)` hands to `compute_loss`.
LOSS_INPUTS = ("probability", "aux_probability", "regularization")


@public("dare_tf")
@keras.saving.register_keras_serializable(package="dare_tf")
class DareModel(TrainingMixin, ServingMixin, keras.Model):
    """Two-stage long-sequence CTR model (DARE, TWIN and their baselines).

    Stage 1, the search (a `dare_tf.search.BehaviorSearch` chosen by
    `ModelConfig.search`), keeps K of the L behaviours by their attention
    embeddings; stage 2 (`TargetAttentionPooling`) pools their representation
    embeddings into `h` and `v_t * h`; `PredictionHead` turns `[v_t, h,
    v_t * h]` into a click probability. Everything that differs between the
    paper's models is in `ModelConfig` (see `dare_tf.model.presets.PRESETS`).

    Call arguments:
        inputs: dict of int tensors `target_item`, `target_category` `[B]`,
            `hist_items`, `hist_categories` `[B, L]` (dense ids, 0 = padding,
            oldest first, most recent last).

    Returns:
        float32 click probability `[B]`; with `training=True` the dict of
        what the loss reads (`probability`, `aux_probability`,
        `regularization`). `forward` returns every output: also the retrieved
        positions and their attention weights.

    Training follows Keras conventions: `compile(optimizer=..., metrics=...)`
    (no `loss=`: `compute_loss` is the model's `task`, a `ClickTask`: the
    click cross entropy, plus the auxiliary head's, plus L2, honouring
    `sample_weight`), then `fit`, `evaluate`, `predict`, on the TensorFlow and
    the JAX backends. How the model runs on TensorFlow (XLA, sparse table
    gradients) is `dare_tf.model.execution`.

    Args:
        config: a `ModelConfig` (or its dict).
        seed: initializer seed.
        jit_compile_dense: TensorFlow backend only: compile the model's forward
            pass (and the L2 term) with XLA inside Keras's train step, whose
            optimizer update stays outside XLA (TensorFlow's fused Adam kernel
            is several times faster than XLA's on CPU, and row-wise updates
            cannot be compiled). Keep Keras's own `compile(jit_compile=...)`
            off on TensorFlow. JAX jits the whole step itself.
        sparse_embedding_gradients: TensorFlow backend: read the table rows
            outside the compiled function, so that the tables' gradients are
            sparse (the batch's rows only). Row-wise optimizers
            (`dare_tf.optimizers.LazyAdam`) need this, and it keeps a step's
            cost independent of the vocabulary. False reads the rows inside
            it and gives dense gradients, which is faster for optimizers that
            update every row anyway (Adam) at small vocabularies.

    Examples:
        >>> from dare_tf import build_model
        >>> model = build_model("dare", num_items=50, num_categories=5, max_len=8, top_k=3)
        >>> model.compile(optimizer="adam")
        >>> x = model.dummy_inputs(4); y = np.array([1.0, 0.0, 1.0, 0.0])
        >>> float(model.evaluate(x, y, verbose=0)) > 0
        True
    """

    def __init__(self, config: ModelConfig | dict, seed: int | None = None,
                 jit_compile_dense: bool = True, sparse_embedding_gradients: bool = True, **kwargs):
        super().__init__(**kwargs)
        cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        self.model_config = cfg
        self.seed = seed
        self.jit_compile_dense = jit_compile_dense
        self.sparse_embedding_gradients = sparse_embedding_gradients
        self.task = ClickTask()
        self._compiled_stages = {}  # dare_tf.model.execution's compiled functions
        ref = cfg.initializer == "reference"
        normal = lambda i: keras.initializers.RandomNormal(  # noqa: E731
            0.0, 0.01, seed=None if seed is None else seed + i)
        self.embedding = BehaviorEmbedding(
            cfg.num_items, cfg.num_categories,
            embedding_dim=cfg.embedding_dim, position_dim=cfg.position_dim,
            attention_embedding_dim=cfg.attention_embedding_dim,
            attention_position_dim=cfg.attention_position_dim,
            num_positions=cfg.num_positions, coupling=cfg.coupling, use_position=cfg.use_position,
            fields=cfg.fields, embeddings_initializer=normal(0),
            projection_initializer=normal(1) if ref else keras.initializers.GlorotUniform(
                None if seed is None else seed + 1),
            projection_regularizer=keras.regularizers.L2(cfg.l2) if cfg.l2 else None,
            row_multiple=cfg.table_row_multiple, name="behavior_embedding")
        sub_seed = lambda i: None if seed is None else seed + 100 * i  # noqa: E731
        self.search = build_search(cfg, seed)
        self.pooling = TargetAttentionPooling(cfg.target_aware, name="pooling")
        self.head = PredictionHead(cfg.mlp_units, initializer=cfg.initializer,
                                   prelu_init=cfg.prelu_init, l2=cfg.l2, seed=sub_seed(2),
                                   synchronized=cfg.synchronized_batch_norm, name="head")
        self.aux_head = None
        if cfg.use_aux_loss:
            self.aux_head = PredictionHead(cfg.aux_mlp_units, initializer=cfg.initializer,
                                           prelu_init=cfg.prelu_init, l2=cfg.l2, seed=sub_seed(3),
                                           synchronized=cfg.synchronized_batch_norm, name="aux_head")

    # -- inputs -----------------------------------------------------------
    def dummy_inputs(self, batch_size: int = 2) -> dict[str, np.ndarray]:
        """Inputs of `batch_size` examples of ones (every field's too), at the model's L."""
        return dummy_inputs(self.model_config, batch_size)

    def example_ids(self, inputs) -> Ids:
        """The dense `Ids` (int32) of a per-example inputs dict, checked against
        the model's `max_len` and fields."""
        return example_ids(inputs, self.model_config.max_len, self.model_config.fields)

    def lookup(self, ids: Ids, roles=ROLES) -> dict:
        """`BehaviorEmbedding.lookup` of `ids` (the fields' too) for `roles`."""
        return self.embedding.lookup(*ids.lookup_args(), roles=roles, **ids.field_kwargs())

    def embeddings(self, inputs, roles=ROLES) -> ExampleEmbeddings:
        """The ids and each role's embeddings (`roles`: all four by default) of
        a per-example inputs dict, as the forward pass computes them
        (`BehaviorEmbedding.lookup`, then `combine`)."""
        ids = self.example_ids(inputs)
        if not self.embedding.built:
            self.embedding.build()
        return ExampleEmbeddings(ids, self.embedding.combine(self.lookup(ids, roles), roles))

    def search_stage(self, embedded: ExampleEmbeddings) -> SearchResult:
        """Stage 1 on `embeddings(inputs)`: the model's search over the histories,
        with the representations of every slot where they were looked up."""
        roles = embedded.roles
        ids = embedded.ids
        return SearchResult.of(self.search(roles["target_attention"], roles["history_attention"],
                                           roles.get("history_representation"), embedded.mask, ids.target_category,
                                           ids.hist_categories))

    # -- forward ----------------------------------------------------------
    def forward(self, inputs, training=False, compiled: bool = True) -> dict:
        """All outputs: `probability`, `aux_probability` (with the auxiliary
        head), `positions` `[B, K]`, `attention_weights` `[B, K]`, the head
        inputs `features` (and `aux_features`), the search's `explain` outputs
        (SDIM: `hash_matches`) and, in training, `regularization` (L2).
        `compiled=False` runs it as written, outside `dare_tf.model.execution`'s
        compiled functions."""
        ids = self.example_ids(inputs)
        if not self.embedding.built:
            self.embedding.build()

        def stages(ids, rows=None):
            if rows is None:
                rows = self.lookup(ids, self._looked_up_roles())
            return self._stages(rows, ids, training)

        execution = _tensorflow_execution() if compiled else None
        return (execution.compiled_stages(self, stages, training) if execution else stages)(ids)

    def retrieved_representation_only(self) -> bool:
        """Whether the forward pass looks up representation rows for the K
        retrieved behaviours only (not `[B, L, Dr]`): with separate
        representation tables (`decoupled`, `four`), a search that selects
        slots without reading representations (`BehaviorSearch.selects_slots`),
        and nothing else that reads every slot's representation (history mean,
        the auxiliary head's attention over all slots). With sparse table
        gradients read outside the compiled function (TensorFlow, `lazy_adam`)
        the rows are read before the search, so all L are."""
        lookups_outside = (keras.backend.backend() == "tensorflow" and self.jit_compile_dense
                           and self.sparse_embedding_gradients)
        return self._kept_slots_suffice() and not lookups_outside

    def _kept_slots_suffice(self) -> bool:
        """Nothing but the kept slots reads a representation: separate representation
        tables, a slot-selecting search, no history mean, no auxiliary attention over
        every slot."""
        cfg = self.model_config
        return (cfg.coupling in ("decoupled", "four") and self.search.selects_slots and not cfg.use_history_mean
                and not self._aux_attends_all())

    def _aux_attends_all(self) -> bool:
        """The reference's auxiliary head: attention over every non-padded slot."""
        return (self.aux_head is not None and self.search.reference_aux_attention
                and self.model_config.aux_attention == "all")

    def _looked_up_roles(self) -> tuple[str, ...]:
        """The roles the forward pass looks up before its search."""
        return ROLES_BEFORE_SEARCH if self.retrieved_representation_only() else ROLES

    def _stages(self, rows, ids, training) -> dict:
        return self.stages_from_embeddings(self.embedding.combine(rows, self._looked_up_roles()), ids, training)

    def stages_from_embeddings(self, emb: dict, ids, training=False, candidates=None) -> dict:
        """`forward`'s outputs from the four role embeddings of `BehaviorEmbedding`
        (`target_attention`, ...) and the `Ids`: search, pooling and heads. Analyses feed
        it embeddings whose paths they separate (`dare_tf.analysis.gradients`).
        `candidates` (N): user-major, the targets are N per user (`[U * N]`,
        user-major order) over `[U, L]` histories (`rank_forward`)."""
        cfg = self.model_config
        target_category, hist_items, hist_categories = ids.target_category, ids.hist_items, ids.hist_categories
        mask = ops.greater(hist_items, 0)
        v_t = emb["target_representation"]
        values = emb.get("history_representation")  # None: looked up for the retrieved slots only
        query, keys = emb["target_attention"], emb["history_attention"]
        late = values is None  # the search only selects: no gradient through its [B, L] scores
        if candidates is None:
            search, search_query, search_category = self.search, query, target_category
        else:  # the N targets of each user against the user's one history
            search = self.search.search_users
            search_query = ops.reshape(query, (-1, candidates, query.shape[-1]))
            search_category = ops.reshape(target_category, (-1, candidates))
        found = SearchResult.of(search(ops.stop_gradient(search_query) if late else search_query,
                                       ops.stop_gradient(keys) if late else keys, values, mask, search_category,
                                       hist_categories))
        positions = found.positions
        if found.pools_itself:  # SDIM
            pooled, weights = found.pooled, found.weights
            if cfg.target_aware:
                pooled = target_aware(v_t, pooled)
        else:
            scores, valid, kept = found.scores, found.valid, found.values
            if late:
                # The K kept slots are looked up again and rescored with gradients: the
                # same values (`scores` exactly), gradients through K rows, not L.
                slots = positions if candidates is None else ops.reshape(positions, (-1, candidates,
                                                                                      positions.shape[-1]))
                rescored = self.search.score(query, self.embedding.history_at(
                    "history_attention", hist_items, hist_categories, slots, ids.history_fields), valid)
                scores = ops.stop_gradient(scores) + (rescored - ops.stop_gradient(rescored))
                kept = self.embedding.history_at("history_representation", hist_items, hist_categories, slots,
                                                 ids.history_fields)
            pooled, weights = self.pooling(v_t, kept, scores, valid, return_attention_weights=True)
        aux_pooled = pooled
        if self._aux_attends_all():
            # The reference's auxiliary head sees attention over every
            # non-padded slot, not only the retrieved ones.
            aux_pooled = self.pooling(v_t, values, self.search.score(search_query, keys, mask), mask)
        features = head_features(v_t, pooled, values, mask, self.model_config, candidates)
        outputs = {
            "probability": self.head(features, training=training),
            "positions": positions,
            "attention_weights": weights,
            "features": features,
            **found.explain,
        }
        if self.aux_head is not None:
            outputs["aux_features"] = ops.concatenate([v_t, aux_pooled], axis=-1)
            outputs["aux_probability"] = self.aux_head(outputs["aux_features"], training=training)
        if training:  # the L2 term, computed with the rest (inside the compiled function)
            outputs["regularization"] = self.regularization()
        return outputs

    def call(self, inputs, training=False):
        out = self.forward(inputs, training=training)
        if training:  # what `compute_loss` reads (Keras hands it `call`'s return value)
            return {k: out[k] for k in LOSS_INPUTS if k in out}
        return out["probability"]

    def build(self, input_shape=None):
        if not self.built:
            self.embedding.build()
            # The sub-layers create their weights on a first pass: eagerly; on JAX traced for the
            # shapes alone, the weights drawn as the scope closes (eagerly each op would compile).
            ids = self.example_ids(self.dummy_inputs())
            first_pass = lambda: self._stages(self.lookup(ids), ids, False)  # noqa: E731
            if keras.backend.backend() == "jax":
                import jax
                with keras.StatelessScope():
                    jax.eval_shape(first_pass)
            else:
                first_pass()
        self.built = True

    def get_config(self):
        return {"config": self.model_config.to_dict(), "seed": self.seed, "name": self.name,
                "jit_compile_dense": self.jit_compile_dense,
                "sparse_embedding_gradients": self.sparse_embedding_gradients}

    @classmethod
    def from_config(cls, config):
        return cls(ModelConfig.from_dict(config["config"]), seed=config.get("seed"),
                   name=config.get("name"), jit_compile_dense=config.get("jit_compile_dense", True),
                   sparse_embedding_gradients=config.get("sparse_embedding_gradients", True))


public_names("dare_tf", "INPUT_KEYS")
