"""The ranker as a TensorFlow Serving SavedModel: raw ids in, click probability out.

`export_saved_model(model, data_dir, export_base, model_name)` writes
`export_base/model_name/<version>/` (built aside, then renamed, so TF Serving
never sees a half-written version) with these signatures:

- `serving_default` (Predict): int64 `target_item`, `target_category` `[B]`
  and `hist_items`, `hist_categories` `[B, T]`: each row a leading column of
  `-T` (the request's own width, `dare_tf.signatures`), then RAW ids, oldest
  first; ids <= 0 after it are padding wherever they stand (the real ids, in
  order, are the history). Raw ids are mapped in-graph through the dataset's
  id maps; unknown ids (negative targets included) go to the
  out-of-vocabulary row. Histories are clipped or left-padded to the model's
  L, keeping the most recent. TF Serving's batcher pads a shorter request
  with its leading `-T`, past the width the row states: never read. A
  history of batch size 1 (`[1, T]`) is shared by every target of the
  request (only without batching: TF Serving's batcher refuses unequal first
  dimensions). Outputs: `probability` `[B]` and `error` `[B]`, the row's own
  refusal ("" when answered; `dare_tf.export.rows`): a row without its
  leading column, a history input narrower than `hist_items`, a negative
  `hist_time_gap`. A malformed row never fails the others of its batch.
- `rank` (Predict): user-major ranking, one row per user, which TF
  Serving's batcher merges across users (`dare_tf.signatures`): int64 raw
  `hist_items`, `hist_categories` `[U, T]` (the leading `-T`, then the ids,
  oldest first), `hist_length` `[U]`, `candidate_items`,
  `candidate_categories` `[U, N]` (`-N`, then the ids), `candidate_count`
  `[U]` -> `probability` `[U, min(N - 1, max_candidates)]` and `error`
  `[U]`. Each history is looked up once and scored against its candidates
  in one product (`DareModel.rank`); the slots past `hist_length` and
  `candidate_count` are never read. A row whose lengths its width cannot
  hold, or whose `candidate_count` is over the export's `max_candidates`,
  gets its `error` and zeros. `rank_explain` also returns `history_index`
  `[U, N, K]` (index into the user's history) and `attention_weight`
  `[U, N, K]`.
- `explain` (Predict): also `history_index` `[B, K]` (index into the
  request's history, -1 for none) and `attention_weight` `[B, K]`; for
  SDIM (K = L, the weight is the share of hash functions that put the
  behaviour in the target's bucket) also `hash_matches` `[B, L, m]` (0/1
  per hash function).
- `classify` (Classify) and `regress` (Regress): serialized `tf.Example`s
  as `inputs` with the same four int64 features (histories as lists);
  outputs `classes` and `scores` (`[1 - p, p]`), or `outputs` (`p`).
- a model with further behaviour fields (`ModelConfig.fields`) takes one more
  input per field and role in every signature: `target_<name>` `[B]`,
  `hist_<name>` beside `hist_items` (and in `rank`, `candidate_<name>`
  `[U, N]`); the time gap's `hist_time_gap` is each behaviour's gap to the
  request's time (`dare_tf.export.fields`). A request without one of them, or
  with an input the signature lacks, is refused by the server, naming it.
- `dataset` (Predict, also in the retrieval export): int64 raw `item_ids`
  `[B]` -> `known` `[B]` (in the id map) and `id_maps` `[B]` (the digest
  of the export's id maps): a client checks that a retrieval model and a
  ranker map raw ids the same way before it chains them; the ranker's also
  `fields` `[B]`, the names of the model's further fields, comma-separated.
- `item_fields` (Predict): int64 raw `item_ids` `[B]` -> per column field
  `<name>` `[B]`, the raw value of the item's field in the dataset (its last
  row's; int64 min for an unknown item): what a client sends as a
  candidate's `candidate_<name>`.

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

from dare_tf._faces import public
from dare_tf._files import clean_stale, require_space, staging_dir, variables_bytes
from dare_tf.data.storage.spec import ID_MAP_FILES, DatasetSpec, id_map_digest, read_id_map
from dare_tf.data.storage.schema import (CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS,
    TARGET_CATEGORY, TARGET_ITEM, TIME_GAP, history_feature)
from dare_tf.data.preparation.dataset_dir import verify_tables
from dare_tf.export import rows
from dare_tf.export.fields import ServedFields
from dare_tf.export.tf_serving import (DATASET_INPUT, DATASET_SIGNATURE, STRING_DATASET_INPUT, WARMUP_FILE,
                                       dataset_outputs, id_table, model_base, next_version, set_method_names,
                                       stand_ins, warmup_requests, write_server_configs)
from dare_tf.models import DareModel
from dare_tf.signatures import (CANDIDATE_COUNT, EXPLAIN, HIST_LENGTH, ITEM_FIELDS, MAX_CANDIDATES, RANK,
                                RANK_EXPLAIN, RANK_REQUEST_INPUTS as RANK_SIGNATURE_INPUTS, ROW_ERROR,
                                SERVING_DEFAULT)

TIME_GAP_INPUT = history_feature(TIME_GAP)
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
        self.model = model
        self.max_len = cfg.max_len
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
        self.input_ranks = {**INPUT_RANKS, **dict.fromkeys(self.fields.target_inputs(), 1),
                            **dict.fromkeys(self.fields.history_inputs(), 2)}
        self.rank_ranks = {**RANK_SIGNATURE_INPUTS, **dict.fromkeys(self.fields.history_inputs(), 2),
                           **dict.fromkeys(self.fields.target_inputs("candidate"), 2)}
        # The inputs that carry ids (strings with `--string_ids`): all but lengths, counts and time gaps.
        self.id_inputs = {n for n in (*self.input_ranks, *self.rank_ranks)
                          if n not in (HIST_LENGTH, CANDIDATE_COUNT, TIME_GAP_INPUT)}

    def dtype(self, name: str):
        """An input's dtype: string for an id input of a `--string_ids` dataset, else int64."""
        return tf.string if self.strings and name in self.id_inputs else tf.int64

    def _stand_in(self, name: str, values, rank: int):
        """A string id input (`--string_ids`) -> its int64 stand-ins (`StringIdTable`)."""
        if self.dtype(name) != tf.string:
            return values
        if name in (TARGET_ITEM, HIST_ITEMS, CANDIDATE_ITEMS):
            table = self.items
        elif name in (TARGET_CATEGORY, HIST_CATEGORIES, CANDIDATE_CATEGORIES):
            table = self.categories
        else:
            table = self.fields.tables[self.fields.name_of(name)]
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
            raw = {name: self._stand_in(name, rows.of_rank(raw[name], rank), rank)
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
            if TIME_GAP_INPUT in raw:
                row_checks.append(rows.negative_gaps(raw[TIME_GAP_INPUT], real))
            error = rows.first_error(tf.shape(hist_items)[0], row_checks)
            real &= (error == "")[:, None]
            aligned = {name: rows.right_aligned(raw[name], real, self.max_len) for name in histories}
            column = rows.right_aligned(column, real, self.max_len)
        real = column >= 0
        # A shared history ([1, T]) is mapped once, then repeated for every target.
        shared = tf.stack([batch // tf.maximum(tf.shape(hist_items)[0], 1), 1])
        inputs = {}
        for name in histories:
            dense = tf.where(real, self._dense(name, aligned[name]), 0)
            inputs[name] = tf.reshape(tf.tile(dense, shared), [-1, self.max_len])
        for name in (TARGET_ITEM, *targets):
            inputs[name] = self._dense(name, raw[name])
        return (inputs, tf.reshape(tf.tile(column, shared), [-1, self.max_len]),
                tf.reshape(tf.tile(error[:, None], shared), [-1]))

    def _dense(self, name: str, raw):
        """An input's raw values -> dense ids (items, categories or a field's)."""
        if name in (TARGET_ITEM, HIST_ITEMS, CANDIDATE_ITEMS):
            return self.items.lookup(raw)
        if name in (TARGET_CATEGORY, HIST_CATEGORIES, CANDIDATE_CATEGORIES):
            return self.categories.lookup(raw)
        return self.fields.dense(self.fields.name_of(name), raw)

    def dataset(self, item_ids):
        out = dataset_outputs(self.items, self.digest, item_ids)
        out["fields"] = tf.fill(tf.shape(out["id_maps"]), self.fields.names)
        return out

    def item_fields(self, item_ids):
        return self.fields.item_values(self.items.lookup(self._stand_in(TARGET_ITEM, tf.reshape(item_ids, [-1]), 1)))

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
        """`rank`'s raw inputs (`rank_ranks`' inputs, in order) -> the model's dense
        `rank` inputs, the history index of each of the model's L slots (`[U, L]`,
        -1 for padding), each candidate's validity `[U, N]` and each row's `error`
        `[U]`. Each 2-D row starts with minus its width (`rows`); only the
        `hist_length` ids and `candidate_count` candidates after that column are
        read (TF Serving's batcher pads what follows them), and at most the
        export's `max_candidates`. A row whose lengths its width cannot hold is
        answered with its error, not read."""
        raw = dict(zip(self.rank_ranks, values))
        rank_checks = [tf.debugging.assert_rank(raw[name], rank, message=(
            f"input {name} must have shape {'[users]' if rank == 1 else '[users, ' + name.split('_')[0] + 's]'}"))
            for name, rank in self.rank_ranks.items()]
        histories = [n for n, rank in self.rank_ranks.items() if rank == 2 and n.startswith("hist_")]
        candidates = [n for n, rank in self.rank_ranks.items() if rank == 2 and n.startswith("candidate_")]
        with tf.control_dependencies(rank_checks):  # (static ranks once they are checked)
            raw = {name: self._stand_in(name, rows.of_rank(raw[name], rank), rank)
                   for name, rank in self.rank_ranks.items()}
            users = tf.shape(raw[HIST_LENGTH])[0]
            shape_checks = [  # (TF Serving's batcher never merges requests these fail)
                tf.debugging.assert_equal(tf.shape(raw[name])[0], users, message=(
                    f"{name}: its first dimension (users) differs from that of {HIST_LENGTH}; every input of a rank "
                    "request has one row per user"))
                for name in self.rank_ranks if name != HIST_LENGTH]
        with tf.control_dependencies(shape_checks):
            raw.update({name: rows.as_wide(raw[name], raw[HIST_ITEMS]) for name in histories[1:]})
            raw.update({name: rows.as_wide(raw[name], raw[CANDIDATE_ITEMS]) for name in candidates[1:]})
            length, count = tf.cast(raw[HIST_LENGTH], tf.int64), tf.cast(raw[CANDIDATE_COUNT], tf.int64)
            width, checks = rows.width_checks(raw, HIST_ITEMS, histories[1:], tf.shape(raw[HIST_ITEMS])[1])
            checks.append(((length < 0) | (length > width - 1), rows.text(
                f"{HIST_LENGTH} ", length, " is outside [0, ", width - 1, "], the ids its history row carries")))
            slots, candidate_checks = rows.width_checks(raw, CANDIDATE_ITEMS, candidates[1:],
                                                        tf.shape(raw[CANDIDATE_ITEMS])[1])
            checks += candidate_checks
            checks.append(((count < 0) | (count > slots - 1), rows.text(
                f"{CANDIDATE_COUNT} ", count, " is outside [0, ", slots - 1, "], the candidates its row carries")))
            checks.append((count > self.max_candidates, rows.text(
                f"{CANDIDATE_COUNT} ", count, " is over this export's limit of ", str(self.max_candidates),
                " candidates per user (serving.export --max_candidates)")))
            # The most recent min(length, L) of the row's `length` ids, right-aligned.
            column = length[:, None] - self.max_len + tf.range(self.max_len, dtype=tf.int64)[None, :]
            at = tf.minimum(tf.maximum(column, 0) + 1, tf.cast(tf.shape(raw[HIST_ITEMS])[1], tf.int64))
            one_more = [[0, 0], [0, 1]]  # (a row of only its leading column still has a slot to gather from)
            gathered = {name: tf.gather(tf.pad(raw[name], one_more), at, batch_dims=1) for name in histories}
            if TIME_GAP_INPUT in raw:
                checks.append(rows.negative_gaps(gathered[TIME_GAP_INPUT], column >= 0))
            error = rows.first_error(users, checks)
        ok = error == ""
        real = ok[:, None] & (column >= 0) & (gathered[HIST_ITEMS] > 0)
        # At most max_candidates after the leading column (a merged batch may be wider).
        cut = {name: raw[name][:, 1:1 + self.max_candidates] for name in candidates}
        valid = ok[:, None] & (tf.range(tf.shape(cut[CANDIDATE_ITEMS])[1], dtype=tf.int64)[None, :] < count[:, None])
        inputs = {**{name: tf.where(real, self._dense(name, gathered[name]), 0) for name in histories},
                  **{name: self._dense(name, cut[name]) for name in candidates}}
        return inputs, tf.where(real, column, -1), valid, error

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
        out = self.predict(*self.parse_examples(inputs))
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
        "classify": (graph.classify, examples),
        "regress": (graph.regress, examples),
        DATASET_SIGNATURE: (graph.dataset, [items]),
        **({ITEM_FIELDS: (graph.item_fields, [items])} if graph.fields.raw_of_item else {}),
    }


@public("dare_tf.serving")
def export_saved_model(model: DareModel, data_dir: str, export_base: str, model_name: str,
                       version: int | None = None, max_candidates: int = MAX_CANDIDATES) -> str:
    """Writes a TF-Serving-ready version directory; returns its path. `rank` requests
    may carry up to `max_candidates` candidates per user."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates={max_candidates}: must be >= 1")
    graph = _ServingGraph(model, data_dir, max_candidates)
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
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.track(graph.items.table)
        archive.track(graph.categories.table)
        for table in graph.fields.trackables():
            archive.track(table)
        for name, (fn, signature) in _signatures(graph).items():
            archive.add_endpoint(name, fn, input_signature=signature)
        archive.write_out(staging, verbose=False)
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
