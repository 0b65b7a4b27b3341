"""TensorFlow Serving plumbing shared by every export: raw-id tables, the `dataset`
signature, Classify/Regress method names, warm-up requests, version directories,
`models.config` and the batching parameters."""

from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf

from dare_tf.data.spec import HIST_CATEGORIES, HIST_ITEMS, TARGET_CATEGORY, TARGET_ITEM

CLASSIFY_METHOD = "tensorflow/serving/classify"


REGRESS_METHOD = "tensorflow/serving/regress"


WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


DATASET_SIGNATURE = "dataset"


DATASET_INPUT = tf.TensorSpec([None], tf.int64, name="item_ids")


class IdTable:
    """Raw id -> dense id through an id-map file (raw id of dense id k on line k),
    shipped as a SavedModel asset; unknown ids map to the OOV row."""

    def __init__(self, path: str, oov: int):
        self.oov = oov
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(path, tf.int64, tf.lookup.TextFileIndex.WHOLE_LINE,
                                          tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            default_value=-1)

    def lookup(self, raw):
        line = self.table.lookup(raw)
        return tf.where(line >= 0, line + 1, tf.constant(self.oov, tf.int64))


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
        meta_graph.signature_def["classify"].method_name = CLASSIFY_METHOD
        meta_graph.signature_def["regress"].method_name = REGRESS_METHOD
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def warmup_requests(model_name: str, raw: dict, max_len: int):
    """PredictionLogs of a batch-1 and a batch-8 request (tensorflow-serving-api protos)."""
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    logs = []
    for batch in (1, 8):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = "serving_default"
        values = {
            TARGET_ITEM: np.full([batch], raw[TARGET_ITEM], np.int64),
            TARGET_CATEGORY: np.full([batch], raw[TARGET_CATEGORY], np.int64),
            HIST_ITEMS: np.full([batch, max_len], raw[TARGET_ITEM], np.int64),
            HIST_CATEGORIES: np.full([batch, max_len], raw[TARGET_CATEGORY], np.int64),
        }
        for name, value in values.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        logs.append(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)))
    return logs


def versions(model_base: str) -> list[int]:
    """The numeric version directories TF Serving would load from `model_base`."""
    if not os.path.isdir(model_base):
        return []
    return sorted(int(d) for d in os.listdir(model_base) if re.fullmatch(r"\d+", d))


def next_version(model_base: str) -> int:
    return max(versions(model_base), default=0) + 1


MODELS_CONFIG = "models.config"


def write_server_configs(export_base: str, max_batch_size: int = 256) -> None:
    """`models.config` listing every model exported into `export_base` (a ranker
    and a retrieval model: one TF Serving process serves both; paths as inside
    the tensorflow/serving container, where `export_base` is `/models`) and
    `batching_parameters.txt`."""
    names = sorted(d for d in os.listdir(export_base) if versions(os.path.join(export_base, d)))
    entries = "".join(f"  config {{\n    name: '{name}'\n    base_path: '/models/{name}'\n"
                      "    model_platform: 'tensorflow'\n  }\n" for name in names)
    with open(os.path.join(export_base, MODELS_CONFIG), "w") as f:
        f.write("model_config_list {\n" + entries + "}\n")
    with open(os.path.join(export_base, "batching_parameters.txt"), "w") as f:
        f.write(f"max_batch_size {{ value: {max_batch_size} }}\n"
                "batch_timeout_micros { value: 1000 }\n"
                "max_enqueued_batches { value: 100 }\n"
                "num_batch_threads { value: 4 }\n"
                "pad_variable_length_inputs: true\n")
