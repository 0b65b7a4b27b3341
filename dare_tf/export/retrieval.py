"""The retrieval stage as a TF Serving SavedModel: raw-id histories in, the top-N
raw item ids, their raw categories and scores out."""

from __future__ import annotations

import os
import shutil

import numpy as np

from dare_tf._files import clean_stale, replace_directory, require_space, staging_dir, variables_bytes
from dare_tf.data.preparation.dataset_dir import verify_tables
from dare_tf.data.storage.spec import ID_MAP_FILES
from dare_tf.data.storage.id_maps import id_map_digest, read_id_map
from dare_tf.export.tf_serving import (DATASET_INPUT, STRING_DATASET_INPUT, dataset_outputs,
                                       id_table, model_base, next_version, write_server_configs)
from dare_tf.retrieval.candidates import ORIGINS, Query
from dare_tf.signatures import DATASET_SIGNATURE, SERVING_DEFAULT
from dare_tf.retrieval.training import RetrievalStage

import tensorflow as tf  # noqa: E402  (after dare_tf.retrieval.model: tf.keras is Keras 2 then)


class _RetrievalServing(tf.Module):
    def __init__(self, stage: RetrievalStage, data_dir: str, top_n: int):
        super().__init__()
        spec, model = stage.spec, stage.model
        # Only the query tower, the candidates' vectors and the merger are saved; the
        # training model's candidate dataset is not serializable.
        self.query = model.query
        self.vectors = tf.constant(model.candidate((tf.constant(stage.items), tf.constant(stage.categories))).numpy())
        self.merger, self.top_n, self.include_seen = stage.merger, top_n, stage.include_seen
        self.quotas = dict(stage.quotas)
        verify_tables(data_dir)  # (the id maps of `data_dir`, as its spec.json records them)
        self.strings = spec.string_ids  # (`--string_ids`: string ids in and out)
        self.items = id_table(os.path.join(data_dir, ID_MAP_FILES["item"]), spec.oov_item, self.strings)
        self.categories = id_table(os.path.join(data_dir, ID_MAP_FILES["category"]), spec.oov_category,
                                   self.strings)
        self.tables = [self.items.table, self.categories.table]  # tracked, so the SavedModel holds them
        self.digest = id_map_digest(data_dir)
        ends, kind, raw = (["", ""], object, str) if self.strings else ([0, -1], np.int64, int)
        raw_items = np.array([ends[0]] + list(map(raw, read_id_map(data_dir, "item"))) + [ends[1]], kind)
        raw_cats = np.array([ends[0]] + list(map(raw, read_id_map(data_dir, "category"))) + [ends[1]], kind)
        self.raw_items = tf.constant(raw_items)
        self.raw_categories_of_items = tf.constant(raw_cats[stage.category_of])

    def signature(self):
        """`serve` with the dataset's id dtype (string ids or int64)."""
        dtype = tf.string if self.strings else tf.int64
        return tf.function(self.serve, input_signature=[tf.TensorSpec([None, None], dtype, name="hist_items"),
                                                        tf.TensorSpec([None, None], dtype, name="hist_categories")])

    def serve(self, hist_items, hist_categories):
        if self.strings:  # (their stand-ins: `StringIdTable`)
            hist_items, hist_categories = self.items.stand_in(hist_items), self.categories.stand_in(hist_categories)
        # A leading padding slot: an empty history ([B, 0]) is all padding, as for the ranker.
        hist_items, hist_categories = (tf.pad(h, [[0, 0], [1, 0]]) for h in (hist_items, hist_categories))
        real = hist_items > 0
        dense = {"hist_items": tf.cast(tf.where(real, self.items.lookup(hist_items), 0), tf.int32),
                 "hist_categories": tf.cast(tf.where(real, self.categories.lookup(hist_categories), 0), tf.int32)}
        scores = tf.matmul(self.query(dense), self.vectors, transpose_b=True)
        proposals = self.merger.proposals(Query(scores, dense["hist_items"], dense["hist_categories"]), self.top_n)
        slots, origins = self.merger.merge(proposals, self.quotas, dense["hist_items"], self.top_n,
                                           self.include_seen, with_origins=True)
        ids = tf.cast(slots, tf.int64) + 1
        return {"items": tf.gather(self.raw_items, ids), "categories": tf.gather(self.raw_categories_of_items, ids),
                "scores": tf.gather(scores, slots, batch_dims=1), "sources": tf.gather(tf.constant(ORIGINS), origins)}

    def dataset(self, item_ids):
        return dataset_outputs(self.items, self.digest, item_ids)


def export_retrieval(run_dir: str, data_dir: str, export_base: str, model_name: str = "retrieval",
                     top_n: int = 200) -> str:
    """Writes `export_base/model_name/<version>/` (built aside, then renamed) with a
    `serving_default` signature: int64 RAW `hist_items`, `hist_categories`
    `[B, T]` (ids <= 0 are padding, unknown ids go to the out-of-vocabulary row)
    -> `items`, `categories` (raw ids), `scores` (the tower's) and `sources`
    (what placed each: a source's name, `filler` or `seen`) of the first
    `top_n` merged candidates (the run's sources and quotas, its seen-items
    setting: `dare_tf.retrieval.candidates`); and the
    `dataset` signature of every export (`dare_tf.export`). Rewrites
    `export_base/models.config` (merged: see `write_server_configs`)."""
    stage = RetrievalStage.load(data_dir, run_dir)
    stage.require_candidates(top_n, "top_n")
    module = _RetrievalServing(stage, data_dir, top_n)
    base = model_base(export_base, model_name)
    clean_stale(base, "version")
    final = os.path.join(base, str(next_version(base)))
    require_space(base, variables_bytes(module.variables) + module.vectors.numpy().nbytes, "the SavedModel")
    staging = staging_dir(base, "version")
    try:
        dataset = tf.function(module.dataset, input_signature=[STRING_DATASET_INPUT if module.strings
                                                               else DATASET_INPUT])
        tf.saved_model.save(module, staging, signatures={SERVING_DEFAULT: module.signature(),
                                                         DATASET_SIGNATURE: dataset})
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_directory(staging, final)
    write_server_configs(export_base)
    return final
