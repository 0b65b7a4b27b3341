"""`DareModel`'s outputs beyond the click probability, as serving and the analyses
read them: user-major ranking (one history, N candidates per user), the
explanations (which behaviours were retrieved, with what weight) and stage 1's
score of every history slot."""

from __future__ import annotations

import keras
from keras import ops

from dare_tf.data.storage.schema import RANK_INPUTS
from dare_tf.layers.embedding_tables import ROLES, ROLES_BEFORE_SEARCH
from dare_tf.model.inputs import rank_ids


class ServingMixin:
    """The ranking and explanation methods of `dare_tf.model.dare_model.DareModel` (a
    `keras.Model` with `embedding`, `search`, `forward` and
    `stages_from_embeddings`)."""

    def rank_forward(self, inputs) -> dict:
        """`forward` for N candidates per user against that user's one history:
        `inputs` `hist_items`, `hist_categories` `[U, L]` and `candidate_items`,
        `candidate_categories` `[U, N]` (dense ids, 0 = padding). Each history's
        embeddings are looked up once; the search scores all N candidates of a
        user in one product (`BehaviorSearch.search_users`); pooling and the head
        run per candidate. The outputs of `explain`, shaped `[U, N, ...]`, equal
        `forward` on the U * N (candidate, history) pairs. Never compiled, not
        for training: serving's path (the export's `rank` signature)."""
        ids, candidates = rank_ids(inputs, self.model_config.max_len, self.model_config.fields)
        if not self.embedding.built:
            self.embedding.build()
        # The representation rows of the K kept slots only, where nothing reads all L.
        roles = ROLES_BEFORE_SEARCH if self._kept_slots_suffice() else ROLES
        emb = self.embedding.combine(self.lookup(ids, roles), roles)
        out = self.stages_from_embeddings(emb, ids, candidates=candidates)
        users = ops.shape(inputs[RANK_INPUTS[0]])[0]
        return {k: ops.reshape(v, (users, candidates, *v.shape[1:]))
                for k, v in out.items() if k in ("probability", "positions", "attention_weights",
                                                 *self.search.explain_outputs)}

    def rank(self, inputs):
        """Click probabilities `[U, N]` of each user's N candidates (`rank_forward`)."""
        return self.rank_forward(inputs)["probability"]

    def explain(self, inputs) -> dict:
        """Probability with the retrieved history positions, attention weights and
        the search's own `explain` outputs (SDIM: `hash_matches`)."""
        out = self.forward(inputs, training=False)
        keep = ("probability", "positions", "attention_weights", *self.search.explain_outputs)
        return {k: out[k] for k in keep if k in out}

    def slot_scores(self, emb: dict, ids) -> "keras.KerasTensor":
        """What stage 1 ranks the history slots by, `[B, L]` float32 (higher
        first; padding -2**32 + 1): the search's `slot_scores` (the scaled dot
        product of attention embeddings for soft search and the attention of
        models without search, DIN's attention MLP score, hard search's
        priority, ...)."""
        return self.search.slot_scores(emb["target_attention"], emb["history_attention"],
                                       ops.greater(ids.hist_items, 0), ids.target_category, ids.hist_categories)
