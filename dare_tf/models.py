"""DareModel: every model of the family as one composition of the shared layers."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from dare_tf.config import ModelConfig, make_config
from dare_tf.layers import (BehaviorEmbedding, DINAttention, PredictionHead,
                            TargetAttentionPooling, TopKBehaviorSearch, scaled_dot_scores)

INPUT_KEYS = ("target_item", "target_category", "hist_items", "hist_categories")
# reference.md adds 1e-8 to the softmax output before the log.
LOG_EPSILON = 1e-8


def click_cross_entropy(labels, probability):
    """Mean two-class cross entropy as the reference computes it: -log(p_label + 1e-8)."""
    labels = ops.reshape(labels, (-1,))
    probability = ops.clip(ops.cast(probability, "float32"), 0.0, 1.0)
    # Pick the label's probability first: written as y*log(p + e) + (1-y)*log(1 - p + e),
    # graph rewriting folds 1 + e to 1 and turns 0 * log(0) into NaN.
    chosen = ops.where(ops.greater(labels, 0.5), probability, 1.0 - probability)
    return -ops.mean(ops.log(chosen + LOG_EPSILON))


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
    """

    def __init__(self, config: ModelConfig | dict, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        self.model_config = cfg
        self.seed = seed
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
        self.search = None
        if cfg.search != "none":
            self.search = TopKBehaviorSearch(
                cfg.top_k, cfg.search, position_dim=cfg.attention_pos_dim, name="search")
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
    def lookup_embeddings(self, inputs, sparse_reads: bool = False) -> dict:
        """The embedding-table rows of a batch (see `BehaviorEmbedding.lookup`)."""
        return self.embedding.lookup(*self._unpack(inputs), sparse_reads=sparse_reads)

    def forward(self, inputs, training=False, gathered=None) -> dict:
        """All outputs: `probability`, `aux_probability` (with the auxiliary
        head), `positions` `[B, K]` and `attention_weights` `[B, K]`.

        `gathered`: the batch's table rows from `lookup_embeddings`, when the
        caller looked them up itself (to keep sparse gradients outside XLA).
        """
        cfg = self.model_config
        target_item, target_category, hist_items, hist_categories = self._unpack(inputs)
        mask = ops.greater(hist_items, 0)
        if gathered is None:
            emb = self.embedding(target_item, target_category, hist_items, hist_categories)
        else:
            emb = self.embedding.combine(gathered)
        v_t = emb["target_representation"]
        values = emb["history_representation"]
        query, keys = emb["target_attention"], emb["history_attention"]
        if self.search is None:
            if self.din_attention is not None:
                scores = self.din_attention(query, keys)
            else:
                scores = scaled_dot_scores(query, keys, cfg.attention_pos_dim)
            pooled, weights = self.pooling(v_t, values, scores, mask, return_attention_weights=True)
            positions = ops.broadcast_to(
                ops.arange(ops.shape(hist_items)[1], dtype="int32")[None, :], ops.shape(hist_items))
            aux_pooled = pooled
        else:
            positions, scores, valid = self.search(query, keys, mask, target_category, hist_categories)
            pooled, weights = self.pooling(v_t, values, scores, valid, positions=positions,
                                           return_attention_weights=True)
            aux_pooled = pooled
            if self.aux_head is not None and cfg.search == "soft" and cfg.aux_attention == "all":
                # The reference's auxiliary head sees attention over every
                # non-padded slot, not only the retrieved ones.
                aux_pooled = self.pooling(v_t, values, self.search.score(query, keys, mask), mask)
        features = [v_t, pooled]
        if cfg.use_history_mean:
            m = ops.cast(ops.expand_dims(mask, -1), values.dtype)
            mean = ops.sum(values * m, axis=1) / (ops.sum(m, axis=1) + 1.0)
            features += [mean, v_t * mean] if cfg.target_aware else [mean]
        outputs = {
            "probability": self.head(ops.concatenate(features, axis=-1), training=training),
            "positions": positions,
            "attention_weights": weights,
        }
        if self.aux_head is not None:
            outputs["aux_probability"] = self.aux_head(
                ops.concatenate([v_t, aux_pooled], axis=-1), training=training)
        return outputs

    def call(self, inputs, training=False):
        return self.forward(inputs, training=training)["probability"]

    def explain(self, inputs) -> dict:
        """Probability with the retrieved history positions and attention weights."""
        out = self.forward(inputs, training=False)
        return {k: out[k] for k in ("probability", "positions", "attention_weights")}

    def batch_norm_layers(self) -> list:
        """The BatchNormalization layers (one in front of each prediction head's MLP)."""
        return [head.norm for head in (self.head, self.aux_head) if head is not None]

    def build(self, input_shape=None):
        if not self.built:
            self.forward(self.dummy_inputs(), training=False)
        self.built = True

    # -- loss and training ----------------------------------------------
    def loss_terms(self, labels, outputs) -> dict:
        """`click` + `aux` (if any) + `regularization` (L2) = `total`."""
        click = click_cross_entropy(labels, outputs["probability"])
        aux = (click_cross_entropy(labels, outputs["aux_probability"])
               if "aux_probability" in outputs else ops.zeros((), "float32"))
        reg = ops.cast(ops.sum(ops.stack(self.losses)), "float32") if self.losses else ops.zeros((), "float32")
        return {"click": click, "aux": aux, "regularization": reg, "total": click + aux + reg}

    def train_step(self, data):
        # model.fit support (TensorFlow backend): the auxiliary loss needs the
        # auxiliary head's output, which `call` does not return.
        import tensorflow as tf

        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            # An optimizer with row-wise updates (LazyAdam) wants row-wise reads.
            gathered = (self.lookup_embeddings(x, sparse_reads=True)
                        if getattr(self.optimizer, "sparse_updates", False) else None)
            out = self.forward(x, training=True, gathered=gathered)
            loss = self.loss_terms(y, out)["total"]
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, out["probability"])
        return {m.name: m.result() for m in self.metrics}

    def get_config(self):
        return {"config": self.model_config.to_dict(), "seed": self.seed, "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(ModelConfig.from_dict(config["config"]), seed=config.get("seed"),
                   name=config.get("name"))


def build_model(preset: str, num_items: int, num_categories: int, max_len: int = 200,
                seed: int | None = None, **overrides) -> DareModel:
    """Builds a named preset (`dare`, `twin`, `twin_hard`, `twin_proj`,
    `twin_no_tr`, `twin_4e`, `din`) as a built `DareModel`.

    `num_items` and `num_categories` are vocabulary sizes including padding
    row 0; `overrides` are `ModelConfig` fields.
    """
    config = make_config(preset, num_items, num_categories, max_len=max_len, **overrides)
    model = DareModel(config, seed=seed, name=preset)
    model.build()
    return model
