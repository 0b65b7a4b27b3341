"""DareModel: every model of the family as one composition of the shared layers."""

from __future__ import annotations

import threading

import keras
import numpy as np
from keras import ops

from dare_tf.config import ModelConfig, make_config
from dare_tf.data.spec import MODEL_INPUTS as INPUT_KEYS
from dare_tf.layers import (BehaviorClustering, BehaviorEmbedding, DINAttention, HashSamplingPooling,
                            PredictionHead, TargetAttentionPooling, TopKBehaviorSearch, scaled_dot_scores)
from dare_tf.layers.embedding import ROLES, ROLES_BEFORE_SEARCH
from dare_tf.layers.pooling import target_aware
from dare_tf.layers.search import PADDING_SCORE, hamming_priority, hard_search_priority

# reference.md adds 1e-8 to the softmax output before the log.
LOG_EPSILON = 1e-8


def click_cross_entropy(labels, probability, sample_weight=None):
    """Two-class cross entropy as the reference computes it, `-log(p_label + 1e-8)`,
    averaged over the batch (Keras's `sum_over_batch_size`: `sum(w * l) / B`)."""
    labels = ops.reshape(ops.cast(labels, "float32"), (-1,))
    probability = ops.clip(ops.reshape(ops.cast(probability, "float32"), (-1,)), 0.0, 1.0)
    # Pick the label's probability first: written as y*log(p + e) + (1-y)*log(1 - p + e),
    # graph rewriting folds 1 + e to 1 and turns 0 * log(0) into NaN.
    chosen = ops.where(ops.greater(labels, 0.5), probability, 1.0 - probability)
    losses = -ops.log(chosen + LOG_EPSILON)
    if sample_weight is not None:
        losses = losses * ops.reshape(ops.cast(sample_weight, "float32"), (-1,))
    return ops.mean(losses)


@keras.saving.register_keras_serializable(package="dare_tf")
class DareModel(keras.Model):
    """Two-stage long-sequence CTR model (DARE, TWIN and their baselines).

    Stage 1 (`TopKBehaviorSearch`) retrieves K of the L behaviours with the
    attention embeddings; stage 2 (`TargetAttentionPooling`) pools their
    representation embeddings into `h` and `v_t * h`; `PredictionHead` turns
    `[v_t, h, v_t * h]` into a click probability. Everything that differs
    between the paper's models is in `ModelConfig` (see `dare_tf.config.PRESETS`).

    Call arguments:
        inputs: dict of int tensors `target_item`, `target_category` `[B]`,
            `hist_items`, `hist_categories` `[B, L]` (dense ids, 0 = padding,
            oldest first, most recent last).

    Returns:
        float32 click probability `[B]`. `forward` returns also the auxiliary
        probability, the retrieved positions and their attention weights.

    Training follows Keras conventions: `compile(optimizer=..., metrics=...)`
    (no `loss=`: the model's `compute_loss` is the click cross entropy, plus
    the auxiliary head's, plus L2, honouring `sample_weight`), then `fit`,
    `evaluate`, `predict`, on the TensorFlow and the JAX backends.

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

    Example:
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
        # The auxiliary head's output and the L2 term of the current step, handed from
        # `call` to `compute_loss` (per thread: mirrored replicas trace in threads of
        # their own).
        self._step_outputs = threading.local()
        self._compiled_stages = {}
        ref = cfg.initializer == "reference"
        normal = lambda i: keras.initializers.RandomNormal(  # noqa: E731
            0.0, 0.01, seed=None if seed is None else seed + i)
        self.embedding = BehaviorEmbedding(
            cfg.num_items, cfg.num_categories,
            embedding_dim=cfg.embedding_dim, position_dim=cfg.position_dim,
            attention_embedding_dim=cfg.attention_embedding_dim,
            attention_position_dim=cfg.attention_position_dim,
            num_positions=cfg.num_positions, coupling=cfg.coupling, use_position=cfg.use_position,
            embeddings_initializer=normal(0),
            projection_initializer=normal(1) if ref else keras.initializers.GlorotUniform(
                None if seed is None else seed + 1),
            projection_regularizer=keras.regularizers.L2(cfg.l2) if cfg.l2 else None,
            name="behavior_embedding")
        sub_seed = lambda i: None if seed is None else seed + 100 * i  # noqa: E731
        self.din_attention = None
        if cfg.scorer == "din":
            self.din_attention = DINAttention(
                cfg.din_units, initializer=cfg.initializer, prelu_init=cfg.prelu_init,
                l2=cfg.l2, seed=sub_seed(1), name="din_attention")
        self.search = self.sampling = self.clustering = None
        if cfg.search == "sdim":
            self.sampling = HashSamplingPooling(cfg.num_hashes, cfg.hash_bits, position_dim=cfg.attention_pos_dim,
                                                seed=sub_seed(4), name="sampling")
        elif cfg.search != "none":
            self.search = TopKBehaviorSearch(
                cfg.top_k, "soft" if cfg.search == "cluster" else cfg.search, position_dim=cfg.attention_pos_dim,
                num_bits=cfg.hash_bits, seed=sub_seed(4), name="search")
        if cfg.search == "cluster":
            self.clustering = BehaviorClustering(cfg.cluster_window, name="clustering")
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
        length = self.model_config.max_len
        return {
            "target_item": np.ones((batch_size,), np.int32),
            "target_category": np.ones((batch_size,), np.int32),
            "hist_items": np.ones((batch_size, length), np.int32),
            "hist_categories": np.ones((batch_size, length), np.int32),
        }

    def _unpack(self, inputs):
        if not isinstance(inputs, dict):
            raise TypeError(f"DareModel expects a dict with keys {INPUT_KEYS}, got {type(inputs).__name__}")
        missing = [k for k in INPUT_KEYS if k not in inputs]
        if missing:
            raise KeyError(f"DareModel inputs lack {missing}; expected keys {INPUT_KEYS}")
        ti, tc, hi, hc = (ops.cast(inputs[k], "int32") for k in INPUT_KEYS)
        if hi.shape[1] is not None and hi.shape[1] != self.model_config.max_len:
            raise ValueError(f"DareModel: hist_items has length {hi.shape[1]}, but the model was "
                             f"built for max_len={self.model_config.max_len}")
        return ti, tc, hi, hc

    # -- forward ----------------------------------------------------------
    def forward(self, inputs, training=False) -> dict:
        """All outputs: `probability`, `aux_probability` (with the auxiliary
        head), `positions` `[B, K]`, `attention_weights` `[B, K]`, and the
        head inputs `features` (and `aux_features`)."""
        ids = self._unpack(inputs)
        if not self.embedding.built:
            self.embedding.build()
        return self._compiled(training)(ids)

    def _compiled(self, training: bool):
        """`ids -> outputs`: the lookups and the dense stages, with the dense stages
        (and with `sparse_embedding_gradients=False` the lookups too) compiled by
        XLA on TensorFlow where that is possible."""
        def stages(ids, rows=None):
            if rows is None:
                rows = self.embedding.lookup(*ids, roles=self._looked_up_roles())
            return self._stages(rows, ids, training)

        compile_ = keras.backend.backend() == "tensorflow" and self.jit_compile_dense
        if compile_:
            import tensorflow as tf

            # Synchronised BatchNorm (several replicas) cannot sit in a nested compiled function.
            compile_ = not (self.model_config.synchronized_batch_norm
                            or tf.distribute.get_strategy().num_replicas_in_sync > 1)
        if not compile_:
            return stages
        if training not in self._compiled_stages:
            import tensorflow as tf

            compiled = tf.function(stages, jit_compile=True, autograph=False)
            if self.sparse_embedding_gradients:
                # Lookups outside the compiled function: the tables' gradients stay sparse.
                self._compiled_stages[training] = lambda ids: compiled(ids, self.embedding.lookup(*ids))
            else:
                self._compiled_stages[training] = compiled
        return self._compiled_stages[training]

    def retrieved_representation_only(self) -> bool:
        """Whether the forward pass looks up representation rows for the K
        retrieved behaviours only (not `[B, L, Dr]`): with separate
        representation tables (`decoupled`, `four`), a top-K search, and
        nothing else that reads every slot's representation (history mean,
        the auxiliary head's attention over all slots, clusters). With sparse
        table gradients read outside the compiled function (TensorFlow,
        `lazy_adam`) the rows are read before the search, so all L are."""
        cfg = self.model_config
        lookups_outside = (keras.backend.backend() == "tensorflow" and self.jit_compile_dense
                           and self.sparse_embedding_gradients)
        return (cfg.coupling in ("decoupled", "four") and self.search is not None and self.clustering is None
                and not cfg.use_history_mean and not lookups_outside and not self._aux_attends_all())

    def _aux_attends_all(self) -> bool:
        """The reference's auxiliary head: attention over every non-padded slot."""
        cfg = self.model_config
        return self.aux_head is not None and cfg.search == "soft" and cfg.aux_attention == "all"

    def _looked_up_roles(self) -> tuple[str, ...]:
        """The roles the forward pass looks up before its search."""
        return ROLES_BEFORE_SEARCH if self.retrieved_representation_only() else ROLES

    def _stages(self, rows, ids, training) -> dict:
        return self.stages_from_embeddings(self.embedding.combine(rows, self._looked_up_roles()), ids, training)

    def stages_from_embeddings(self, emb: dict, ids, training=False) -> dict:
        """`forward`'s outputs from the four role embeddings of `BehaviorEmbedding`
        (`target_attention`, ...) and the ids `(target_item, target_category,
        hist_items, hist_categories)`: search, pooling and heads. Analyses feed
        it embeddings whose paths they separate (`dare_tf.analysis.gradients`)."""
        cfg = self.model_config
        target_item, target_category, hist_items, hist_categories = ids
        mask = ops.greater(hist_items, 0)
        v_t = emb["target_representation"]
        values = emb.get("history_representation")  # None: looked up for the retrieved slots only
        query, keys = emb["target_attention"], emb["history_attention"]
        extra = {}
        if self.sampling is not None:
            pooled, weights, extra["hash_matches"] = self.sampling(query, keys, values, mask)
            if cfg.target_aware:
                pooled = target_aware(v_t, pooled)
            positions = ops.broadcast_to(
                ops.arange(ops.shape(hist_items)[1], dtype="int32")[None, :], ops.shape(hist_items))
            aux_pooled = pooled
        elif self.search is None:
            if self.din_attention is not None:
                scores = self.din_attention(query, keys)
            else:
                scores = scaled_dot_scores(query, keys, cfg.attention_pos_dim)
            pooled, weights = self.pooling(v_t, values, scores, mask, return_attention_weights=True)
            positions = ops.broadcast_to(
                ops.arange(ops.shape(hist_items)[1], dtype="int32")[None, :], ops.shape(hist_items))
            aux_pooled = pooled
        else:
            late = values is None  # the search only selects: no gradient through its [B, L] scores
            search_query = ops.stop_gradient(query) if late else query
            keys = ops.stop_gradient(keys) if late else keys
            search_keys, search_values, search_mask, bias = self.search_space(keys, values, hist_categories, mask)
            positions, scores, valid = self.search(search_query, search_keys, search_mask, target_category,
                                                   hist_categories, score_bias=bias)
            if late:
                # The K kept slots are looked up again and rescored with gradients: the
                # same values (`scores` exactly), gradients through K rows, not L.
                kept = self.embedding.history_at("history_attention", hist_items, hist_categories, positions)
                rescored = self.search.score(query, kept, valid)
                scores = ops.stop_gradient(scores) + (rescored - ops.stop_gradient(rescored))
                pooled, weights = self.pooling(
                    v_t, self.embedding.history_at("history_representation", hist_items, hist_categories, positions),
                    scores, valid, return_attention_weights=True)
            else:
                pooled, weights = self.pooling(v_t, search_values, scores, valid, positions=positions,
                                               return_attention_weights=True)
            aux_pooled = pooled
            if self._aux_attends_all():
                # The reference's auxiliary head sees attention over every
                # non-padded slot, not only the retrieved ones.
                aux_pooled = self.pooling(v_t, values, self.search.score(query, keys, mask), mask)
        features = [v_t, pooled]
        if cfg.use_history_mean:
            m = ops.cast(ops.expand_dims(mask, -1), values.dtype)
            mean = ops.sum(values * m, axis=1) / (ops.sum(m, axis=1) + 1.0)
            features += [mean, v_t * mean] if cfg.target_aware else [mean]
        features = ops.concatenate(features, axis=-1)
        outputs = {
            "probability": self.head(features, training=training),
            "positions": positions,
            "attention_weights": weights,
            "features": features,
            **extra,
        }
        if self.aux_head is not None:
            outputs["aux_features"] = ops.concatenate([v_t, aux_pooled], axis=-1)
            outputs["aux_probability"] = self.aux_head(outputs["aux_features"], training=training)
        if training:  # the L2 term, computed with the rest (inside the compiled function)
            outputs["regularization"] = self._regularization()
        return outputs

    def slot_scores(self, emb: dict, ids) -> "keras.KerasTensor":
        """What stage 1 ranks the history slots by, `[B, L]` float32 (higher
        first; padding -2**32 + 1): the scaled dot product of attention
        embeddings (soft search, and the attention of models without search),
        DIN's attention MLP score (DIN), or hard search's priority (same category
        as the target first, then recency)."""
        _, target_category, hist_items, hist_categories = ids
        mask = ops.greater(hist_items, 0)
        query, keys = emb["target_attention"], emb["history_attention"]
        search = self.model_config.search
        if self.din_attention is not None:
            scores = ops.cast(self.din_attention(query, keys), "float32")
        elif search == "hard":
            scores = ops.cast(hard_search_priority(mask, target_category, hist_categories), "float32")
        elif search == "simhash":
            scores = ops.cast(hamming_priority(self.search.signatures(query), self.search.signatures(keys), mask,
                                               self.search.num_bits), "float32")
        elif search == "sdim":
            scores = self.sampling(query, keys, emb["history_representation"], mask)[1]
        elif search == "cluster":
            keys, _, mask, bias = self.search_space(keys, emb["history_representation"], hist_categories, mask)
            scores = self.search.score(query, keys, mask, bias)
        else:
            scores = scaled_dot_scores(query, keys, self.model_config.attention_pos_dim)
        return ops.where(mask, scores, PADDING_SCORE)

    def search_space(self, keys, values, hist_categories, mask):
        """What stage 1 searches: `(keys, values, mask, score_bias)`, the history
        itself (no bias), or with clustering (TWIN-V2) its clusters, with
        log(cluster size) as the score bias."""
        if self.clustering is None:
            return keys, values, mask, None
        keys, values, sizes, valid = self.clustering(keys, values, hist_categories, mask)
        return keys, values, valid, ops.log(ops.maximum(sizes, 1.0))

    def _regularization(self):
        losses = self.losses
        if not losses:
            return ops.zeros((), "float32")
        return ops.sum(ops.stack([ops.cast(loss, "float32") for loss in losses]))

    def call(self, inputs, training=False):
        out = self.forward(inputs, training=training)
        self._step_outputs.value = out
        return out["probability"]

    def explain(self, inputs) -> dict:
        """Probability with the retrieved history positions and attention weights."""
        out = self.forward(inputs, training=False)
        return {k: out[k] for k in ("probability", "positions", "attention_weights", "hash_matches") if k in out}

    def batch_norm_layers(self) -> dict:
        """Head input name (`features`, `aux_features`) -> the BatchNormalization
        layer in front of that prediction head's MLP."""
        heads = {"features": self.head, "aux_features": self.aux_head}
        return {name: head.norm for name, head in heads.items() if head is not None}

    def build(self, input_shape=None):
        if not self.built:
            self.embedding.build()
            # Eagerly, uncompiled: the sub-layers create their weights here.
            ids = self._unpack(self.dummy_inputs())
            self._stages(self.embedding.lookup(*ids), ids, False)
        self.built = True

    # -- loss ------------------------------------------------------------
    def loss_terms(self, labels, outputs, sample_weight=None) -> dict:
        """`click` + `aux` (if any) + `regularization` (L2) = `total`, float32."""
        click = click_cross_entropy(labels, outputs["probability"], sample_weight)
        aux = (click_cross_entropy(labels, outputs["aux_probability"], sample_weight)
               if outputs.get("aux_probability") is not None else ops.zeros((), "float32"))
        reg = outputs.get("regularization")
        reg = self._regularization() if reg is None else reg
        return {"click": click, "aux": aux, "regularization": reg, "total": click + aux + reg}

    def train_step(self, *args):
        """Keras's train step. On TensorFlow with `jit_compile_dense=True` and
        `sparse_embedding_gradients=False` (one replica), the same step with the
        forward pass, `compute_loss` and the gradients in one XLA function (the
        optimizer update stays outside it). With it, `benchmarks/bench_train.py
        --parts ab` measured the dense-Adam step at 50k items at 0.92x the earlier
        hand-written step, against 0.68x with Keras's default step (README). Same
        loss tracking, loss scaling, update and metrics as Keras's default step."""
        if not self._whole_gradient_in_xla():  # (JAX passes the state first: Keras's own step)
            return super().train_step(*args)
        import tensorflow as tf

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(args[0])
        if "gradients" not in self._compiled_stages:
            self._compiled_stages["gradients"] = tf.function(self._loss_and_gradients, jit_compile=True,
                                                             autograph=False)
        loss, gradients, y_pred = self._compiled_stages["gradients"](x, y, sample_weight)
        self._loss_tracker.update_state(loss, sample_weight=tf.shape(y_pred)[0])
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _whole_gradient_in_xla(self) -> bool:
        if keras.backend.backend() != "tensorflow" or not self.jit_compile_dense or self.sparse_embedding_gradients:
            return False
        import tensorflow as tf

        return (not self.model_config.synchronized_batch_norm and not self.jit_compile
                and tf.distribute.get_strategy().num_replicas_in_sync == 1
                and getattr(self, "_loss_tracker", None) is not None)

    def _loss_and_gradients(self, x, y, sample_weight):
        import tensorflow as tf

        with tf.GradientTape() as tape:
            ids = self._unpack(x)
            outputs = self._stages(self.embedding.lookup(*ids), ids, True)
            self._step_outputs.value = outputs
            loss = self.compute_loss(x, y, outputs["probability"], sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_weights)
        return loss, [tf.convert_to_tensor(g) for g in gradients], outputs["probability"]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The training objective of `fit` and the loss of `evaluate`: `loss_terms(...)["total"]`.

        `y_pred` is `call`'s probability; the auxiliary head's output of the
        same call is taken from the model (Keras's `compute_loss` sees only
        `call`'s return value).
        """
        if getattr(self, "_compile_loss", None) is not None:
            raise ValueError("DareModel computes its own loss (click + auxiliary cross entropy + L2, "
                             "see DareModel.compute_loss): compile it without `loss=`")
        step = getattr(self._step_outputs, "value", None) or {}
        outputs = {"probability": y_pred, "aux_probability": step.get("aux_probability"),
                   "regularization": step.get("regularization")}
        total = self.loss_terms(y, outputs, sample_weight)["total"]
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            # Keras's convention under a distribution strategy: each replica returns its
            # share, the gradients are summed over replicas.
            if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False:
                total = total / tf.distribute.get_strategy().num_replicas_in_sync
        return total

    def get_config(self):
        return {"config": self.model_config.to_dict(), "seed": self.seed, "name": self.name,
                "jit_compile_dense": self.jit_compile_dense,
                "sparse_embedding_gradients": self.sparse_embedding_gradients}

    @classmethod
    def from_config(cls, config):
        return cls(ModelConfig.from_dict(config["config"]), seed=config.get("seed"),
                   name=config.get("name"), jit_compile_dense=config.get("jit_compile_dense", True),
                   sparse_embedding_gradients=config.get("sparse_embedding_gradients", True))


def build_model(preset: str, num_items: int, num_categories: int, max_len: int = 200,
                seed: int | None = None, jit_compile_dense: bool = True,
                sparse_embedding_gradients: bool = True, **overrides) -> DareModel:
    """Builds a named preset (`dare_tf.PRESETS`) as a built `DareModel`.

    `num_items` and `num_categories` are vocabulary sizes including padding
    row 0; `overrides` are `ModelConfig` fields.
    """
    config = make_config(preset, num_items, num_categories, max_len=max_len, **overrides)
    model = DareModel(config, seed=seed, name=preset, jit_compile_dense=jit_compile_dense,
                      sparse_embedding_gradients=sparse_embedding_gradients)
    model.build()
    return model
