"""The ranker as a TensorFlow Serving SavedModel: raw ids in, click probability out.

`export_saved_model(model, data_dir, export_base, model_name)` writes
`export_base/model_name/<version>/` (built aside, then renamed, so TF Serving
never sees a half-written version) with these signatures:

- `serving_default` (Predict): int64 `target_item`, `target_category` `[B]`
  and `hist_items`, `hist_categories` `[B, T]` of RAW ids, any T, oldest
  first; ids <= 0 in a history are padding. Raw ids are mapped in-graph
  through the dataset's id maps; unknown ids (negative targets included) go
  to the out-of-vocabulary row. Histories are clipped or left-padded to the
  model's L, keeping the most recent. A history of batch size 1 (`[1, T]`)
  is shared by every target of the request: scoring N candidates for one
  user with a 10,000-behaviour history sends 2 x 10,000 ids, not N times
  that. Output: `probability` `[B]`.
- `explain` (Predict): also `history_index` `[B, K]` (index into the
  request's history, -1 for none) and `attention_weight` `[B, K]`; for
  SDIM (K = L, the weight is the share of hash functions that put the
  behaviour in the target's bucket) also `hash_matches` `[B, L, m]` (0/1
  per hash function).
- `classify` (Classify) and `regress` (Regress): serialized `tf.Example`s
  as `inputs` with the same four int64 features (histories as lists);
  outputs `classes` and `scores` (`[1 - p, p]`), or `outputs` (`p`).
- `dataset` (Predict, also in the retrieval export): int64 raw `item_ids`
  `[B]` -> `known` `[B]` (in the id map) and `id_maps` `[B]` (the digest
  of the export's id maps): a client checks that a retrieval model and a
  ranker map raw ids the same way before it chains them.

plus `assets.extra/tf_serving_warmup_requests`, and beside the model
directory `models.config` (every model exported into `export_base`) and
`batching_parameters.txt` for the `tensorflow/serving` container.
"""

from __future__ import annotations

import os
import shutil

import keras
import tensorflow as tf
from absl import logging

from dare_tf._files import clean_stale, staging_dir
from dare_tf.data.spec import (HIST_CATEGORIES, HIST_ITEMS, ID_MAP_FILES, MODEL_INPUTS, TARGET_CATEGORY,
                               TARGET_ITEM, DatasetSpec, id_map_digest, read_id_map)
from dare_tf.export.tf_serving import (DATASET_INPUT, DATASET_SIGNATURE, WARMUP_FILE, IdTable, dataset_outputs,
                                       model_base, next_version, set_method_names, warmup_requests, write_server_configs)
from dare_tf.models import DareModel

# Rank of each serving input: targets [B], histories [B, T].
INPUT_RANKS = {TARGET_ITEM: 1, TARGET_CATEGORY: 1, HIST_ITEMS: 2, HIST_CATEGORIES: 2}


class _ServingGraph:
    """The in-graph preprocessing and the endpoint functions around a model."""

    def __init__(self, model: DareModel, data_dir: str):
        spec = DatasetSpec.load(data_dir)
        cfg = model.model_config
        if (cfg.num_items, cfg.num_categories) != (spec.num_items, spec.num_categories):
            raise ValueError(
                f"model vocabularies ({cfg.num_items} items, {cfg.num_categories} categories) do not match "
                f"{data_dir}/spec.json ({spec.num_items}, {spec.num_categories})")
        self.model = model
        self.max_len = cfg.max_len
        self.items = IdTable(os.path.join(data_dir, ID_MAP_FILES["item"]), spec.oov_item)
        self.categories = IdTable(os.path.join(data_dir, ID_MAP_FILES["category"]), spec.oov_category)
        self.digest = id_map_digest(data_dir)
        try:
            self.raw_examples = {TARGET_ITEM: int(read_id_map(data_dir, "item")[0]),
                                 TARGET_CATEGORY: int(read_id_map(data_dir, "category")[0])}
        except ValueError as e:
            raise ValueError(f"{data_dir}: id maps hold non-integer raw ids ({e}); serving takes int64 ids") from e

    def model_inputs(self, target_item, target_category, hist_items, hist_categories):
        """Raw ids -> the model's dense inputs; also the left padding and the request's T."""
        raw = dict(zip(MODEL_INPUTS, (target_item, target_category, hist_items, hist_categories)))
        rank_checks = [
            tf.debugging.assert_rank(raw[name], rank, message=(
                f"input {name} must have shape {'[batch]' if rank == 1 else '[batch, history_length]'}"))
            for name, rank in INPUT_RANKS.items()]
        with tf.control_dependencies(rank_checks):  # before any op that relies on the ranks
            target_item = tf.reshape(raw[TARGET_ITEM], [-1])
            target_category = tf.reshape(raw[TARGET_CATEGORY], [-1])
            hist_items = tf.identity(raw[HIST_ITEMS])
            hist_categories = tf.identity(raw[HIST_CATEGORIES])
        batch = tf.shape(target_item)[0]
        checks = [
            tf.debugging.assert_equal(tf.shape(target_category)[0], batch,
                                      message="target_category and target_item batch sizes differ"),
            tf.debugging.Assert(
                (tf.shape(hist_items)[0] == batch) | (tf.shape(hist_items)[0] == 1),
                ["hist_items must have the batch size of target_item, or 1 (one history shared by every "
                 "target); got", tf.shape(hist_items)[0], "and", batch]),
            tf.debugging.assert_equal(tf.shape(hist_categories), tf.shape(hist_items),
                                      message="hist_categories and hist_items shapes differ"),
        ]
        with tf.control_dependencies(checks):
            length = tf.shape(hist_items)[1]
            hist_items = hist_items[:, -self.max_len:]
            hist_categories = hist_categories[:, -self.max_len:]
        pad = self.max_len - tf.shape(hist_items)[1]
        real = hist_items > 0
        dense_items = tf.where(real, self.items.lookup(hist_items), 0)
        dense_cats = tf.where(real, self.categories.lookup(hist_categories), 0)
        paddings = [[0, 0], [pad, 0]]
        # A shared history ([1, T]) is mapped once, then repeated for every target.
        rows = tf.stack([batch // tf.maximum(tf.shape(hist_items)[0], 1), 1])
        inputs = {
            TARGET_ITEM: self.items.lookup(target_item),
            TARGET_CATEGORY: self.categories.lookup(target_category),
            HIST_ITEMS: tf.reshape(tf.tile(tf.pad(dense_items, paddings), rows), [-1, self.max_len]),
            HIST_CATEGORIES: tf.reshape(tf.tile(tf.pad(dense_cats, paddings), rows), [-1, self.max_len]),
        }
        return inputs, pad, length

    def dataset(self, item_ids):
        return dataset_outputs(self.items, self.digest, item_ids)

    def predict(self, target_item, target_category, hist_items, hist_categories):
        inputs, _, _ = self.model_inputs(target_item, target_category, hist_items, hist_categories)
        return {"probability": self.model(inputs, training=False)}

    def explain(self, target_item, target_category, hist_items, hist_categories):
        inputs, pad, length = self.model_inputs(target_item, target_category, hist_items, hist_categories)
        out = self.model.explain(inputs)
        slots = tf.cast(out["positions"], tf.int32)
        index = slots - pad + tf.maximum(length - self.max_len, 0)
        weight = out["attention_weights"]
        result = {
            "probability": out["probability"],
            "history_index": tf.cast(tf.where((slots >= pad) & (weight > 0), index, -1), tf.int64),
            "attention_weight": weight,
        }
        for name in self.model.search.explain_outputs:  # per slot of history_index (SDIM: hash_matches)
            result[name] = tf.cast(out[name], tf.int64)
        return result

    def parse_examples(self, serialized):
        spec = {name: tf.io.FixedLenFeature([], tf.int64) if rank == 1 else tf.io.VarLenFeature(tf.int64)
                for name, rank in INPUT_RANKS.items()}
        parsed = tf.io.parse_example(tf.reshape(serialized, [-1]), spec)
        return tuple(parsed[name] if INPUT_RANKS[name] == 1 else _left_aligned(parsed[name])
                     for name in MODEL_INPUTS)

    def classify(self, inputs):
        p = self.predict(*self.parse_examples(inputs))["probability"]
        classes = tf.tile(tf.constant([["0", "1"]]), [tf.shape(p)[0], 1])
        return {"classes": classes, "scores": tf.stack([1.0 - p, p], axis=1)}

    def regress(self, inputs):
        return {"outputs": self.predict(*self.parse_examples(inputs))["probability"]}


def _left_aligned(sparse: tf.SparseTensor) -> tf.Tensor:
    """Dense [B, T] of variable-length rows, each right-aligned (left-padded with 0)."""
    dense = tf.sparse.to_dense(sparse, default_value=0)
    lengths = tf.cast(tf.RaggedTensor.from_sparse(sparse).row_lengths(), tf.int32)
    width = tf.shape(dense)[1]
    index = tf.range(width)[None, :] - (width - lengths)[:, None]
    valid = index >= 0
    return tf.where(valid, tf.gather(dense, tf.maximum(index, 0), batch_dims=1), tf.zeros_like(dense))


def _signatures(graph: _ServingGraph) -> dict:
    # Unknown rank, so that a wrong-rank request reaches the signature's own
    # check and its message, not an internal error from deep in the graph.
    raw = [tf.TensorSpec(None, tf.int64, name=name) for name in MODEL_INPUTS]
    examples = [tf.TensorSpec(None, tf.string, name="inputs")]
    return {
        "serving_default": (graph.predict, raw),
        "explain": (graph.explain, raw),
        "classify": (graph.classify, examples),
        "regress": (graph.regress, examples),
        DATASET_SIGNATURE: (graph.dataset, [DATASET_INPUT]),
    }


def export_saved_model(model: DareModel, data_dir: str, export_base: str, model_name: str,
                       version: int | None = None) -> str:
    """Writes a TF-Serving-ready version directory; returns its path."""
    graph = _ServingGraph(model, data_dir)
    base = model_base(export_base, model_name)
    version = next_version(base) if version is None else version
    final = os.path.join(base, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists: TF Serving versions are immutable; pick another --version")
    for path in clean_stale(base, "version"):
        logging.info("removed %s, left by a killed export", path)
    staging = staging_dir(base, "version")
    # The SavedModel holds plain TensorFlow graphs (no XLA clusters), which any
    # TF Serving build runs.
    jit, model.jit_compile_dense = model.jit_compile_dense, False
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.track(graph.items.table)
        archive.track(graph.categories.table)
        for name, (fn, signature) in _signatures(graph).items():
            archive.add_endpoint(name, fn, input_signature=signature)
        archive.write_out(staging, verbose=False)
        set_method_names(staging)
        os.makedirs(os.path.join(staging, "assets.extra"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(staging, WARMUP_FILE)) as writer:
            for log in warmup_requests(model_name, graph.raw_examples, graph.max_len):
                writer.write(log.SerializeToString())
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        model.jit_compile_dense = jit
    write_server_configs(export_base)
    return final
