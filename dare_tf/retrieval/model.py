"""The two-tower candidate generator (Keras 2 layers, for tensorflow-recommenders).

The one module of dare_tf that touches Keras 2 (`tf_keras`) and
tensorflow-recommenders: everything else imports TensorFlow and Keras 3 as
usual and reaches the two-tower model through the functions here.
"""

from __future__ import annotations

import os

from dare_tf._faces import public, public_names
from dare_tf.retrieval._keras2 import require_keras2
from dare_tf.run_directory import RunDirectory

keras2 = require_keras2()
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402

KS = (10, 50, 100, 200)


@public("dare_tf.retrieval")
class QueryTower(keras2.Model):
    """The user's history (item and category ids, 0 = padding, oldest first, as the
    ranker takes them) -> one vector, read with recency: the masked mean of
    `concat(item, category)` embeddings over the whole history (long-term
    interests), a position-weighted sum over its last `recent` behaviours (one
    learned weight per position from the end, softmax over the real ones), and
    the most recent behaviour (the next click follows the current session);
    then a dense layer."""

    def __init__(self, num_items, num_categories, embedding_dim, output_dim, recent=50, **kwargs):
        super().__init__(**kwargs)
        self.recent = recent
        self.items = keras2.layers.Embedding(num_items, embedding_dim, name="history_item_embedding")
        self.categories = keras2.layers.Embedding(num_categories, embedding_dim, name="history_category_embedding")
        self.position_logits = keras2.layers.Embedding(recent, 1, embeddings_initializer="zeros",
                                                       name="recency_logits")
        self.dense = keras2.layers.Dense(output_dim, name="query_projection")

    def call(self, inputs):
        hist_items, hist_categories = inputs["hist_items"], inputs["hist_categories"]
        vectors = tf.concat([self.items(hist_items), self.categories(hist_categories)], axis=-1)
        mask = tf.cast(hist_items > 0, vectors.dtype)[..., None]
        mean = tf.reduce_sum(vectors * mask, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        # The last `recent` slots (padding is on the left), position 0 = the most recent.
        width = tf.minimum(tf.shape(hist_items)[1], self.recent)
        last_vectors, last_mask = vectors[:, -width:], mask[:, -width:]
        logits = self.position_logits(tf.range(width - 1, -1, -1))[None]  # [1, width, 1]
        logits = tf.where(last_mask > 0, logits, tf.constant(-1e9, logits.dtype))
        weights = tf.nn.softmax(logits, axis=1) * last_mask
        recent = tf.reduce_sum(weights * last_vectors, axis=1)
        return self.dense(tf.concat([mean, recent, vectors[:, -1]], axis=-1))


@public("dare_tf.retrieval")
class CandidateTower(keras2.Model):
    """An item id and its category -> one vector."""

    def __init__(self, num_items, num_categories, embedding_dim, output_dim, **kwargs):
        super().__init__(**kwargs)
        self.items = keras2.layers.Embedding(num_items, embedding_dim, name="candidate_item_embedding")
        self.categories = keras2.layers.Embedding(num_categories, embedding_dim,
                                                  name="candidate_category_embedding")
        self.dense = keras2.layers.Dense(output_dim, name="candidate_projection")

    def call(self, inputs):
        item, category = inputs
        return self.dense(tf.concat([self.items(item), self.categories(category)], axis=-1))


@public("dare_tf.retrieval")
class TwoTowerModel(tfrs.Model):
    """Sampled-softmax retrieval (`tfrs.tasks.Retrieval`, accidental hits removed)
    with `tfrs.metrics.FactorizedTopK` against the whole catalogue (`catalogue`:
    item ids and their categories).

    A training batch's negatives are the other positives of the batch and, with
    `uniform_negatives` > 0, that many catalogue items drawn uniformly per batch (mixed
    negative sampling: rare items get negatives the batch under-samples). With
    `popularity_correction`, each candidate's logit is corrected by the log of
    its expected count among a batch's candidates (logQ correction):
    `batch * share + uniform_negatives / catalogue`, where `share` is its share of the
    training clicks (the feature `sampling_probability` for the batch's
    targets, `click_share` per catalogue slot for the drawn ones)."""

    def __init__(self, num_items, num_categories, embedding_dim, output_dim, catalogue, ks=KS,
                 popularity_correction=True, uniform_negatives=0, click_share=None):
        super().__init__()
        if uniform_negatives and popularity_correction and click_share is None:
            raise ValueError("uniform_negatives > 0 with popularity_correction needs click_share (per catalogue "
                             "slot)")
        self.query = QueryTower(num_items, num_categories, embedding_dim, output_dim)
        self.candidate = CandidateTower(num_items, num_categories, embedding_dim, output_dim)
        items, categories = catalogue
        candidates = tf.data.Dataset.from_tensor_slices((items, categories)).batch(4096).map(
            lambda i, c: (i, self.candidate((i, c))))
        self.task = tfrs.tasks.Retrieval(metrics=tfrs.metrics.FactorizedTopK(candidates=candidates, ks=ks),
                                         remove_accidental_hits=True)
        self.popularity_correction = popularity_correction
        self.uniform_negatives = int(uniform_negatives)
        self._catalogue = (tf.constant(items, tf.int32), tf.constant(categories, tf.int32))
        self._click_share = None if click_share is None else tf.constant(click_share, tf.float32)
        self._config = dict(num_items=num_items, num_categories=num_categories, embedding_dim=embedding_dim,
                            output_dim=output_dim, ks=tuple(ks), popularity_correction=popularity_correction,
                            uniform_negatives=self.uniform_negatives)

    def get_config(self) -> dict:
        """The sizes and settings (the catalogue's arrays are data, not configuration:
        `load_retrieval_model` passes them again)."""
        return dict(self._config, ks=list(self._config["ks"]))

    def negative_slots(self):
        """The catalogue slots drawn as one training batch's extra negatives (uniform)."""
        return tf.random.uniform([self.uniform_negatives], maxval=tf.shape(self._catalogue[0])[0], dtype=tf.int32)

    def compute_loss(self, features, training=False):
        query = self.query(features)
        items, categories = tf.cast(features["target_item"], tf.int32), tf.cast(features["target_category"], tf.int32)
        probability = features.get("sampling_probability") if self.popularity_correction else None
        if training and self.uniform_negatives:
            slots = self.negative_slots()
            items = tf.concat([items, tf.gather(self._catalogue[0], slots)], 0)
            categories = tf.concat([categories, tf.gather(self._catalogue[1], slots)], 0)
            if probability is not None:
                share = tf.concat([tf.cast(probability, tf.float32), tf.gather(self._click_share, slots)], 0)
                batch = tf.cast(tf.shape(query)[0], tf.float32)
                catalogue = tf.cast(tf.shape(self._catalogue[0])[0], tf.float32)
                probability = batch * share + self.uniform_negatives / catalogue
        candidate = self.candidate((items, categories))
        return self.task(query, candidate, candidate_sampling_probability=probability, candidate_ids=items,
                         compute_metrics=not training)


@public("dare_tf.retrieval")
def brute_force_index(model: TwoTowerModel, catalogue, k: int):
    """`tfrs.layers.factorized_top_k.BruteForce` over the catalogue: history -> top-k item ids."""
    items, categories = catalogue
    index = tfrs.layers.factorized_top_k.BruteForce(model.query, k=k)
    index.index_from_dataset(tf.data.Dataset.from_tensor_slices((items, categories)).batch(4096).map(
        lambda i, c: (i, model.candidate((i, c)))))
    return index


def compiled_two_tower(num_items: int, num_categories: int, embedding_dim: int, output_dim: int, catalogue,
                       learning_rate: float, seed: int, popularity_correction: bool = True, uniform_negatives: int = 0,
                       click_share=None) -> TwoTowerModel:
    """A `TwoTowerModel` seeded by `seed`, compiled with Adagrad."""
    keras2.utils.set_random_seed(seed)
    model = TwoTowerModel(num_items, num_categories, embedding_dim, output_dim, catalogue,
                          popularity_correction=popularity_correction, uniform_negatives=uniform_negatives,
                          click_share=click_share)
    model.compile(optimizer=keras2.optimizers.Adagrad(learning_rate))
    return model


def fit_epochs(model: TwoTowerModel, dataset, epochs: int, initial_epoch: int, on_epoch_end, log_dir: str,
               verbose: int = 0) -> None:
    """`model.fit` from `initial_epoch` to `epochs`, calling `on_epoch_end(epoch)` after
    each (1-based), with TensorBoard logs in `log_dir`."""

    class EpochEnd(keras2.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            on_epoch_end(epoch + 1)

    model.fit(dataset, epochs=epochs, initial_epoch=initial_epoch, verbose=verbose,
              callbacks=[EpochEnd(), keras2.callbacks.TensorBoard(log_dir)])


@public("dare_tf.retrieval")
def load_retrieval_model(run_dir: str, spec, items, categories, seed: int | None = None) -> TwoTowerModel:
    """A finished `train_retrieval` run's towers (its first seed unless `seed`)."""
    run = RunDirectory(run_dir)
    cfg = run.require("retrieval", spec.fingerprint())["retrieval_config"]
    seed = cfg["seeds"][0] if seed is None else seed
    model = TwoTowerModel(spec.num_items, spec.num_categories, cfg["embedding_dim"], cfg["output_dim"],
                          (items, categories))
    width = spec.max_len
    model.query({"hist_items": tf.zeros([1, width], tf.int32), "hist_categories": tf.zeros([1, width], tf.int32)})
    model.candidate((tf.constant([1]), tf.constant([1])))
    model.query.load_weights(os.path.join(run.seed_dir(seed), "query_tower")).expect_partial()
    model.candidate.load_weights(os.path.join(run.seed_dir(seed), "candidate_tower")).expect_partial()
    return model


public_names("dare_tf.retrieval", "KS")
