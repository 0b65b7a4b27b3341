"""The ranker as a TensorFlow Serving SavedModel: raw ids in, click probability out.

`export_saved_model(model, data_dir, export_base, model_name)` writes
`export_base/model_name/<version>/` (built aside, then renamed, so TF Serving
never sees a half-written version) with the signatures `dare_tf.signatures`
describes (`serving_default`, `explain`, `rank`, `rank_explain`, `classify`, `regress`,
`dataset`, `vocabulary`, `item_fields`): raw ids are mapped in-graph through the dataset's
id maps (`_ServingGraph`; `rank`'s rows: `dare_tf.export.user_major`), plus
`assets.extra/tf_serving_warmup_requests`, and beside the model directory `models.config`
(every model exported into `export_base`) and `batching_parameters.txt` for TF Serving.
"""

from __future__ import annotations

import os
import shutil

import tensorflow as tf
from absl import logging

from dare_tf._faces import public
from dare_tf._files import clean_stale, require_space, staging_dir, variables_bytes
from dare_tf.data.storage.fields import FieldSchema
from dare_tf.data.storage.spec import ID_MAP_FILES, DatasetSpec
from dare_tf.data.storage.id_maps import id_map_digest, read_id_map
from dare_tf.data.storage.schema import (CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS,
    HIST_TIME_GAP, TARGET_CATEGORY, TARGET_ITEM)
from dare_tf.data.preparation.dataset_dir import verify_tables
from dare_tf.export import rows, user_major
from dare_tf.export.fields import ServedFields
from dare_tf.export.tf_serving import (DATASET_INPUT, STRING_DATASET_INPUT, WARMUP_FILE,
                                       dataset_outputs, id_table, model_base, next_version, saved_root,
                                       set_method_names, stand_ins, warmup_requests, write_server_configs)
from dare_tf.model.dare_model import DareModel
from dare_tf.signatures import (CANDIDATE_COUNT, CLASSIFY, DATASET_SIGNATURE, EXPLAIN, HIST_LENGTH, ITEM_FIELDS,
                                MAX_CANDIDATES, RANK, RANK_EXPLAIN, RANK_REQUEST_INPUTS as RANK_SIGNATURE_INPUTS,
                                REGRESS, ROW_ERROR, SERVING_DEFAULT, VOCABULARY)

# Rank of each serving input: targets [B], histories [B, T].
INPUT_RANKS = {TARGET_ITEM: 1, TARGET_CATEGORY: 1, HIST_ITEMS: 2, HIST_CATEGORIES: 2}


class _ServingGraph:
    """The in-graph preprocessing and the endpoint functions around a model."""

    def __init__(self, model: DareModel, data_dir: str, max_candidates: int = MAX_CANDIDATES):
        spec = DatasetSpec.load(data_dir)
        verify_tables(data_dir, spec)
        self.max_candidates = max_candidates
        cfg = model.model_config
        if (cfg.num_items, cfg.num_categories) != (spec.num_items, spec.num_categories):
            raise ValueError(
                f"model vocabularies ({cfg.num_items} items, {cfg.num_categories} categories) do not match "
                f"{data_dir}/spec.json ({spec.num_items}, {spec.num_categories})")
        self.model, self.max_len, self.notes = model, cfg.max_len, ""
        self.predict_function = self.predict  # (Classify's and Regress's: the export's serving_default)
        self.strings = spec.string_ids  # (`--string_ids`: string inputs, mapped to stand-ins at once)
        self.items = id_table(os.path.join(data_dir, ID_MAP_FILES["item"]), spec.oov_item, self.strings)
        self.categories = id_table(os.path.join(data_dir, ID_MAP_FILES["category"]), spec.oov_category, self.strings)
        self.digest = id_map_digest(data_dir)
        raw = str if self.strings else int
        try:
            self.raw_examples = {TARGET_ITEM: raw(read_id_map(data_dir, "item")[0]),
                                 TARGET_CATEGORY: raw(read_id_map(data_dir, "category")[0])}
            self.fields = ServedFields(cfg.fields, spec, data_dir)
        except ValueError as e:
            if "spec.json's fields" in str(e):
                raise
            raise ValueError(f"{data_dir}: id maps hold non-integer raw ids ({e}); serving takes int64 ids") from e
        # Every input of the per-example signatures and of `rank`, with its rank.
        schema = self.fields.schema
        self.input_ranks = {**INPUT_RANKS, **dict.fromkeys(schema.inputs("target"), 1),
                            **dict.fromkeys(schema.inputs("hist"), 2)}
        self.rank_ranks = {**RANK_SIGNATURE_INPUTS, **dict.fromkeys(schema.inputs("hist"), 2),
                           **dict.fromkeys(schema.inputs("candidate"), 2)}
        # The inputs that carry ids (strings with `--string_ids`): all but lengths, counts and time gaps.
        self.id_inputs = {n for n in (*self.input_ranks, *self.rank_ranks)
                          if n not in (HIST_LENGTH, CANDIDATE_COUNT, HIST_TIME_GAP)}

    def dtype(self, name: str):
        """An input's dtype: string for an id input of a `--string_ids` dataset, else int64."""
        return tf.string if self.strings and name in self.id_inputs else tf.int64

    def stand_in(self, name: str, values, rank: int):
        """A string id input (`--string_ids`) -> its int64 stand-ins (`StringIdTable`)."""
        if self.dtype(name) != tf.string:
            return values
        if name in (TARGET_ITEM, HIST_ITEMS, CANDIDATE_ITEMS):
            table = self.items
        elif name in (TARGET_CATEGORY, HIST_CATEGORIES, CANDIDATE_CATEGORIES):
            table = self.categories
        else:
            table = self.fields.tables[FieldSchema.field_of(name)]
        return stand_ins(table, values, rank)

    def model_inputs(self, *values):
        """Raw ids (`input_ranks`' inputs, in order) -> the model's dense inputs; also
        the left padding and the request's T."""
        raw = dict(zip(self.input_ranks, values))
        rank_checks = [
            tf.debugging.assert_rank(raw[name], rank, message=(
                f"input {name} must have shape {'[batch]' if rank == 1 else '[batch, history_length]'}"))
            for name, rank in self.input_ranks.items()]
        with tf.control_dependencies(rank_checks):  # before any op that relies on the ranks
            raw = {name: self.stand_in(name, rows.of_rank(raw[name], rank), rank)
                   for name, rank in self.input_ranks.items()}
        hist_items, batch = raw[HIST_ITEMS], tf.shape(raw[TARGET_ITEM])[0]
        targets = [n for n, rank in self.input_ranks.items() if rank == 1 and n != TARGET_ITEM]
        histories = [n for n, rank in self.input_ranks.items() if rank == 2]
        checks = [
            *(tf.debugging.assert_equal(tf.shape(raw[name])[0], batch,
                                        message=f"{name} and target_item batch sizes differ") for name in targets),
            tf.debugging.Assert(
                (tf.shape(hist_items)[0] == batch) | (tf.shape(hist_items)[0] == 1),
                ["hist_items must have the batch size of target_item, or 1 (one history shared by every "
                 "target); got", tf.shape(hist_items)[0], "and", batch]),
        ]
        raw.update({name: rows.as_wide(raw[name], hist_items) for name in histories if name != HIST_ITEMS})
        with tf.control_dependencies(checks):
            # Each row states its request's width in its leading column (`rows`): the
            # ids <= 0 before it are padding, and so is all TF Serving's batcher put
            # after it. The real ids, in order, right-aligned; none of a malformed row's.
            column = tf.broadcast_to(tf.range(tf.shape(hist_items)[1], dtype=tf.int64), tf.shape(hist_items))
            width, row_checks = rows.width_checks(raw, HIST_ITEMS, [n for n in histories if n != HIST_ITEMS],
                                                  tf.shape(hist_items)[1])
            real = (hist_items > 0) & (column < width[:, None])
            if HIST_TIME_GAP in raw:
                row_checks.append(rows.negative_gaps(raw[HIST_TIME_GAP], real))
            error = rows.first_error(tf.shape(hist_items)[0], row_checks)
            real &= (error == "")[:, None]
            aligned = {name: rows.right_aligned(raw[name], real, self.max_len) for name in histories}
            column = rows.right_aligned(column, real, self.max_len)
        real = column >= 0
        # A shared history ([1, T]) is mapped once, then repeated for every target.
        shared = tf.stack([batch // tf.maximum(tf.shape(hist_items)[0], 1), 1])
        inputs = {}
        for name in histories:
            dense = tf.where(real, self.dense(name, aligned[name]), 0)
            inputs[name] = tf.reshape(tf.tile(dense, shared), [-1, self.max_len])
        for name in (TARGET_ITEM, *targets):
            inputs[name] = self.dense(name, raw[name])
        return (inputs, tf.reshape(tf.tile(column, shared), [-1, self.max_len]),
                tf.reshape(tf.tile(error[:, None], shared), [-1]))

    def dense(self, name: str, raw):
        """An input's raw values -> dense ids (items, categories or a field's)."""
        if name in (TARGET_ITEM, HIST_ITEMS, CANDIDATE_ITEMS):
            return self.items.lookup(raw)
        if name in (TARGET_CATEGORY, HIST_CATEGORIES, CANDIDATE_CATEGORIES):
            return self.categories.lookup(raw)
        return self.fields.dense(FieldSchema.field_of(name), raw)

    def dataset(self, item_ids):  # (and the ranker's fields, and the history length it reads)
        out = dataset_outputs(self.items, self.digest, item_ids)
        rows = tf.shape(out["id_maps"])
        return {**out, "fields": tf.fill(rows, self.fields.names), "notes": tf.fill(rows, self.notes),
                "max_len": tf.fill(rows, tf.constant(self.max_len, tf.int64))}

    def vocabulary(self, item_ids, category_ids):  # (whether the id maps hold each click's item and category)
        return {f"{kind}_known": table.table.lookup(tf.reshape(ids, [-1])) >= 0
                for kind, table, ids in (("item", self.items, item_ids), ("category", self.categories, category_ids))}

    def item_fields(self, item_ids):
        return self.fields.item_values(self.items.lookup(self.stand_in(TARGET_ITEM, tf.reshape(item_ids, [-1]), 1)))

    def predict(self, *values):
        inputs, _, error = self.model_inputs(*values)
        return {"probability": tf.where(error == "", self.model(inputs, training=False), 0.0), ROW_ERROR: error}

    def explain(self, *values):
        inputs, column, error = self.model_inputs(*values)
        result = self._explained(self.model.explain(inputs), column)
        result["probability"] = tf.where(error == "", result["probability"], 0.0)
        return {**result, ROW_ERROR: error}

    def _explained(self, out: dict, column) -> dict:
        """An `explain` result in the request's terms: each kept slot's `history_index`
        (`column`: the request's index of each of the model's L slots, -1 for padding)."""
        slots = tf.cast(out["positions"], tf.int32)
        weight = out["attention_weights"]
        index = tf.gather(column, slots, batch_dims=len(slots.shape) - 1)
        result = {
            "probability": out["probability"],
            "history_index": tf.where(weight > 0, index, -1),
            "attention_weight": weight,
        }
        for name in self.model.search.explain_outputs:  # per slot of history_index (SDIM: hash_matches)
            result[name] = tf.cast(out[name], tf.int64)
        return result

    # -- user-major ranking: one history per user, N candidates per user ---------
    def rank_inputs(self, *values):
        """`dare_tf.export.user_major.rank_inputs` of this graph."""
        return user_major.rank_inputs(self, *values)

    def rank(self, *raw):  # (the inputs of `rank_ranks`, in order)
        inputs, _, candidates, error = self.rank_inputs(*raw)
        return {"probability": tf.where(candidates, self.model.rank(inputs), 0.0), ROW_ERROR: error}

    def rank_explain(self, *raw):
        inputs, column, candidates, error = self.rank_inputs(*raw)
        out = self.model.rank_forward(inputs)
        candidates_per_user = tf.shape(out["positions"])[1]
        column = tf.repeat(column[:, None, :], candidates_per_user, axis=1)  # [U, N, L]
        result = self._explained(out, column)
        result["probability"] = tf.where(candidates, result["probability"], 0.0)
        result["history_index"] = tf.where(candidates[..., None], result["history_index"], -1)
        return {**result, ROW_ERROR: error}

    def parse_examples(self, serialized):
        spec = {name: tf.io.FixedLenFeature([], self.dtype(name)) if rank == 1
                else tf.io.VarLenFeature(self.dtype(name)) for name, rank in self.input_ranks.items()}
        parsed = tf.io.parse_example(tf.reshape(serialized, [-1]), spec)
        return tuple(parsed[name] if rank == 1 else rows.left_aligned(parsed[name])
                     for name, rank in self.input_ranks.items())

    def _answered(self, inputs):
        """`predict` of serialized Examples: Classify and Regress have no per-row error,
        so a refused row (a negative `hist_time_gap`) fails the request, naming it."""
        out = self.predict_function(*self.parse_examples(inputs))
        refused = out[ROW_ERROR] != ""
        check = tf.debugging.Assert(~tf.reduce_any(refused), [
            "an example of the request was refused:", tf.boolean_mask(out[ROW_ERROR], refused)[:1]])
        with tf.control_dependencies([check]):
            return tf.identity(out["probability"])

    def classify(self, inputs):
        p = self._answered(inputs)
        classes = tf.tile(tf.constant([["0", "1"]]), [tf.shape(p)[0], 1])
        return {"classes": classes, "scores": tf.stack([1.0 - p, p], axis=1)}

    def regress(self, inputs):
        return {"outputs": self._answered(inputs)}


def _signatures(graph: _ServingGraph) -> dict:
    # Unknown rank, so that a wrong-rank request reaches the signature's own
    # check and its message, not an internal error from deep in the graph.
    raw = [tf.TensorSpec(None, graph.dtype(name), name=name) for name in graph.input_ranks]
    ranked = [tf.TensorSpec(None, graph.dtype(name), name=name) for name in graph.rank_ranks]
    items = STRING_DATASET_INPUT if graph.strings else DATASET_INPUT
    examples = [tf.TensorSpec(None, tf.string, name="inputs")]
    return {
        SERVING_DEFAULT: (graph.predict, raw),
        EXPLAIN: (graph.explain, raw),
        RANK: (graph.rank, ranked),
        RANK_EXPLAIN: (graph.rank_explain, ranked),
        CLASSIFY: (graph.classify, examples),
        REGRESS: (graph.regress, examples),
        DATASET_SIGNATURE: (graph.dataset, [items]),
        VOCABULARY: (graph.vocabulary, [items, tf.TensorSpec([None], items.dtype, name="category_ids")]),
        **({ITEM_FIELDS: (graph.item_fields, [items])} if graph.fields.raw_of_item else {}),
    }


@public("dare_tf.serving")
def export_saved_model(model: DareModel, data_dir: str, export_base: str, model_name: str,
                       version: int | None = None, max_candidates: int = MAX_CANDIDATES, notes=()) -> str:
    """Writes a TF-Serving-ready version directory; returns its path. `rank` requests
    may carry up to `max_candidates` candidates per user; `notes` (the run's warnings:
    an undertrained model) travel in its `dataset` signature."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates={max_candidates}: must be >= 1")
    graph = _ServingGraph(model, data_dir, max_candidates)
    graph.notes = "\n".join(notes)
    base = model_base(export_base, model_name)
    version = next_version(base) if version is None else version
    final = os.path.join(base, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists: TF Serving versions are immutable; pick another --version")
    for path in clean_stale(base, "version"):
        logging.info("removed %s, left by a killed export", path)
    require_space(base, variables_bytes(model.weights), "the SavedModel")
    staging = staging_dir(base, "version")
    # The SavedModel holds plain TensorFlow graphs (no XLA clusters), which any
    # TF Serving build runs.
    jit, model.jit_compile_dense = model.jit_compile_dense, False
    try:
        signatures = _signatures(graph)
        root = saved_root(model, [graph.items.table, graph.categories.table, *graph.fields.trackables()], signatures)
        graph.predict_function = getattr(root, SERVING_DEFAULT)  # (Classify and Regress call it: no model traced again)
        tf.saved_model.save(root, staging, signatures={name: getattr(root, name) for name in signatures})
        set_method_names(staging)
        os.makedirs(os.path.join(staging, "assets.extra"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(staging, WARMUP_FILE)) as writer:
            for log in warmup_requests(model_name, graph.raw_examples, graph.max_len, graph.fields.examples,
                                       {f.name for f in graph.fields.fields if f.history_only}):
                writer.write(log.SerializeToString())
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        model.jit_compile_dense = jit
    write_server_configs(export_base)
    return final
