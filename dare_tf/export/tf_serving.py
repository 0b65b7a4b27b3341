"""TensorFlow Serving plumbing shared by every export: raw-id tables, the `dataset`
signature, Classify/Regress method names, warm-up requests, version directories,
`models.config` and the batching parameters."""

from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf

from dare_tf.data.storage.schema import (CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS,
    TARGET_CATEGORY, TARGET_ITEM, history_feature)
from dare_tf.data.storage.id_maps import read_id_file
from dare_tf.signatures import (CANDIDATE_COUNT, CLASSIFY, CLASSIFY_METHOD, HIST_LENGTH, MAX_BATCH_SIZE, RANK,
                                REGRESS, REGRESS_METHOD, SERVING_DEFAULT, versions, with_width_column)

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
DATASET_INPUT = tf.TensorSpec([None], tf.int64, name="item_ids")
STRING_DATASET_INPUT = tf.TensorSpec([None], tf.string, name="item_ids")  # (`--string_ids`)


def saved_root(model, trackables: list, functions: dict):
    """What a SavedModel of `model` holds, laid out as `keras.export.ExportArchive` lays
    it out: the model's variables, `trackables` (the id tables) and an attribute per
    signature, `functions` ({name: (function, input signature)}) as tf.functions.
    `tf.saved_model.save(root, path, signatures=...)` then traces each once, in its
    own context (ExportArchive traces each first outside it, to list its variables,
    a trace saving cannot reuse: the export's time twice over)."""
    root = tf.__internal__.tracking.AutoTrackable()
    root.variables, root.tables = list(model.variables), list(trackables)
    root.trainable_variables, root.non_trainable_variables = list(model.trainable_variables), list(
        model.non_trainable_variables)
    for name, (function, signature) in functions.items():
        setattr(root, name, tf.function(function, input_signature=signature, autograph=False))
    return root


class IdTable:
    """Raw id -> dense id through an id-map file (raw id of dense id k on line k),
    shipped as a SavedModel asset; unknown ids map to the OOV row."""

    def __init__(self, path: str, oov: int, key_dtype=tf.int64):
        self.oov = oov
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(path, key_dtype, tf.lookup.TextFileIndex.WHOLE_LINE,
                                          tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            default_value=-1)

    def lookup(self, raw):
        line = self.table.lookup(raw)
        return tf.where(line >= 0, line + 1, tf.constant(self.oov, tf.int64))


class StringIdTable(IdTable):
    """String id -> dense id through an id-map file of strings (`--string_ids`).

    `stand_in` maps a string input to int64 stand-ins for raw ids, on which the
    rest of the graph runs as on an integer dataset's: line k's string -> k + 1,
    an unknown string -> the map's size + 1 (out of vocabulary), "" -> 0
    (padding); `lookup` maps stand-ins to dense ids as `IdTable.lookup` maps
    raw ids."""

    def __init__(self, path: str, oov: int):
        super().__init__(path, oov, tf.string)
        self.size = len(read_id_file(path))

    def stand_in(self, text):
        line = self.table.lookup(text)
        return tf.where(text == "", tf.constant(0, tf.int64), tf.where(line >= 0, line + 1, self.size + 1))

    def lookup(self, stand_in):
        return tf.where((stand_in >= 1) & (stand_in <= self.size), stand_in, tf.constant(self.oov, tf.int64))


def id_table(path: str, oov: int, strings: bool):
    """The table of an id map: `StringIdTable` for string ids, else `IdTable`."""
    return StringIdTable(path, oov) if strings else IdTable(path, oov)


def stand_ins(table: StringIdTable, values, rank: int):
    """A string input of rank 1 or 2 -> its int64 stand-ins (`StringIdTable`); a
    `[rows, T]` input's leading column (`-T` as text, `dare_tf.signatures`) ->
    its number (0 where it is not one: the row's width check names it)."""
    if rank == 1:
        return table.stand_in(values)
    first = values[:, :1]
    number = tf.strings.regex_full_match(first, r"-?[0-9]{1,18}")
    leading = tf.where(number, tf.strings.to_number(tf.where(number, first, "0"), tf.int64), 0)
    return tf.concat([leading, table.stand_in(values[:, 1:])], axis=1)


def dataset_outputs(items: IdTable, digest: str, item_ids) -> dict:
    """The `dataset` signature of every export: `known` (raw item id in the id map)
    and `id_maps` (the export's id-map digest, once per row, so that the
    signature batches like the others)."""
    ids = tf.reshape(item_ids, [-1])
    return {"known": items.table.lookup(ids) >= 0, "id_maps": tf.fill(tf.shape(ids), digest)}


def set_method_names(export_dir: str) -> None:
    """Keras writes every signature as Predict; TF Serving's Classify and
    Regress APIs need their own method names."""
    from tensorflow.core.protobuf import saved_model_pb2

    path = os.path.join(export_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    for meta_graph in proto.meta_graphs:
        meta_graph.signature_def[CLASSIFY].method_name = CLASSIFY_METHOD
        meta_graph.signature_def[REGRESS].method_name = REGRESS_METHOD
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def warmup_requests(model_name: str, raw: dict, max_len: int, fields: dict | None = None,
                    history_only=frozenset()):
    """PredictionLogs of a batch-1 and a batch-8 `serving_default` request and of a
    one-user `rank` request with 8 candidates (tensorflow-serving-api protos);
    `fields`: a raw value of each further field the model reads (`history_only`:
    those without a target input)."""
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    item, category = raw[TARGET_ITEM], raw[TARGET_CATEGORY]
    fields = fields or {}

    def of_fields(role, shape, history_shape):
        return {**{history_feature(n): np.full(history_shape, v, _kind(v)) for n, v in fields.items()},
                **{f"{role}_{n}": np.full(shape, v, _kind(v)) for n, v in fields.items() if n not in history_only}}

    def led(values: dict) -> dict:  # every 2-D row behind its leading -width (`dare_tf.signatures`)
        return {name: with_width_column(v) if v.ndim == 2 else v for name, v in values.items()}

    requests = [(SERVING_DEFAULT, led({
        TARGET_ITEM: np.full([batch], item, _kind(item)), TARGET_CATEGORY: np.full([batch], category, _kind(category)),
        HIST_ITEMS: np.full([batch, max_len], item, _kind(item)),
        HIST_CATEGORIES: np.full([batch, max_len], category, _kind(category)),
        **of_fields("target", [batch], [batch, max_len])})) for batch in (1, 8)]
    candidates = 8
    requests.append((RANK, led({
        HIST_ITEMS: np.full([1, max_len], item, _kind(item)),
        HIST_CATEGORIES: np.full([1, max_len], category, _kind(category)),
        HIST_LENGTH: np.array([max_len], np.int64), CANDIDATE_ITEMS: np.full([1, candidates], item, _kind(item)),
        CANDIDATE_CATEGORIES: np.full([1, candidates], category, _kind(category)),
        CANDIDATE_COUNT: np.array([candidates], np.int64), **of_fields("candidate", [1, candidates], [1, max_len])})))
    logs = []
    for signature, values in requests:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        for name, value in values.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        logs.append(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)))
    return logs


def _kind(value):
    """A raw id's numpy dtype: object for a string id, else int64."""
    return object if isinstance(value, str) else np.int64


def next_version(model_base: str) -> int:
    return max(versions(model_base), default=0) + 1


MODELS_CONFIG = "models.config"
BATCHING_FILE = "batching_parameters.txt"
EXPORTED_MARK = ".dare_tf_export"  # in a model's base directory: this package exported it
_WRITTEN_BY = "# written by dare_tf.export (a file without this first line is kept as it is)\n"
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def model_base(export_base: str, model_name: str) -> str:
    """`export_base/model_name`, created, for a model name that is one path component
    of `[A-Za-z0-9_.-]` not starting with `.` (what models.config, REST URLs and the
    file system all take as it is); marks it as exported by this package."""
    if not isinstance(model_name, str) or not _MODEL_NAME.fullmatch(model_name):
        raise ValueError(f"model_name={model_name!r}: a model name is letters, digits, '_', '.' and '-', "
                         "not starting with '.' (one directory under the export base)")
    if model_name in (MODELS_CONFIG, BATCHING_FILE):
        raise ValueError(f"model_name={model_name!r}: the name of the server's file that serving.export writes "
                         f"beside the models in {export_base}; pick another name")
    path = os.path.join(export_base, model_name)
    ours = os.path.exists(os.path.join(path, EXPORTED_MARK))
    if os.path.lexists(path) and not ours and (not os.path.isdir(path) or any(
            not entry.startswith(".version.") for entry in os.listdir(path))):  # (but a killed export's staging)
        raise ValueError(f"model_name={model_name!r}: {path} exists and was not written by serving.export (no "
                         f"{EXPORTED_MARK} in it); nothing of it is replaced: pick another name or --export_base")
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, EXPORTED_MARK), "a").close()
    return path


def _exported_models(export_base: str) -> list[str]:
    """Models this package exported into `export_base` that hold a version."""
    return sorted(d for d in os.listdir(export_base) if _MODEL_NAME.fullmatch(d)
                  and os.path.exists(os.path.join(export_base, d, EXPORTED_MARK))
                  and versions(os.path.join(export_base, d)))


def _model_config_list_end(text: str, path: str) -> int:
    """Offset of the closing brace of `model_config_list { ... }` in a models.config
    (or of its `>`: text format also writes a message as `< ... >`); the field and
    the braces are found outside comments and quotes (a comment that mentions
    `model_config_list {` is a comment)."""
    field = re.compile(r"model_config_list\s*:?\s*[{<]")
    depth, i, quote = 0, 0, None
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#":
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
        elif depth == 0:
            opening = field.match(text, i) if c == "m" and (i == 0 or not (text[i - 1].isalnum()
                                                                              or text[i - 1] == "_")) else None
            if opening:
                depth, i = 1, opening.end()
                continue
        elif c in "{<":
            depth += 1
        elif c in "}>":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    if depth == 0:
        raise ValueError(f"{path}: holds no model_config_list {{ ... }}: dare_tf.export adds its models to a "
                         "TF Serving model config; move this file away or write its models there")
    raise ValueError(f"{path}: model_config_list {{ is never closed")


def write_server_configs(export_base: str, max_batch_size: int = MAX_BATCH_SIZE) -> None:
    """Adds every model this package exported into `export_base` (a ranker and a
    retrieval model: one TF Serving process serves both; base paths as inside the
    tensorflow/serving container, where `export_base` is `/models`) to
    `models.config`, and writes `batching_parameters.txt`.

    A `models.config` already there is merged into, not replaced: its entries and
    settings (other models, version policies, ...) stay as they are, byte for
    byte; only entries for models it does not list yet are added. A batching file
    not written by this package is kept.

    The batching parameters pad variable-length inputs (TF Serving's
    `pad_variable_length_inputs`): requests with histories of different
    lengths are merged, each padded after its ids with its first value, the
    leading minus-width column that every row of `rank` and `serving_default`
    starts with: the signatures read no slot past the width a row states."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    path = os.path.join(export_base, MODELS_CONFIG)
    text = open(path).read() if os.path.exists(path) else "model_config_list {\n}\n"
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ValueError(f"{path}: not a TF Serving model config ({e}); dare_tf.export adds its models to it, "
                         "so fix or move it") from e
    listed = {entry.name for entry in config.model_config_list.config}
    new = [name for name in _exported_models(export_base) if name not in listed]
    if new or not os.path.exists(path):
        end = _model_config_list_end(text, path)
        entries = "".join(f"  config {{\n    name: '{name}'\n    base_path: '/models/{name}'\n"
                          "    model_platform: 'tensorflow'\n  }\n" for name in new)
        staged = f"{path}.tmp-{os.getpid()}"
        with open(staged, "w") as f:
            f.write(text[:end] + entries + text[end:])
        os.replace(staged, path)
    batching = os.path.join(export_base, BATCHING_FILE)
    if not os.path.exists(batching) or open(batching).readline() == _WRITTEN_BY:
        with open(batching, "w") as f:
            f.write(_WRITTEN_BY + f"max_batch_size {{ value: {max_batch_size} }}\n"
                    "batch_timeout_micros { value: 1000 }\n"
                    "max_enqueued_batches { value: 100 }\n"
                    "num_batch_threads { value: 4 }\n"
                    "pad_variable_length_inputs: true\n")
