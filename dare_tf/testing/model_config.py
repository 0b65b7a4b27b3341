"""What the stand-in reads of TF Serving's configuration files: a `models.config`
(the models' names and base paths) and a batching parameters file."""

from __future__ import annotations

import dataclasses
import os
import re

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from dare_tf.signatures import MAX_BATCH_SIZE

CONTAINER_ROOT = "/models/"


def read_model_config(path: str) -> dict[str, str]:
    """Model name -> base path from a TF Serving `models.config` (text
    `ModelServerConfig`). Base paths under `/models/` (the container's mount
    point, as `serving.export` writes them) are read relative to the config
    file's directory, which the README's `docker run` mounts there."""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        with open(path) as f:
            text_format.Parse(f.read(), config)
    except text_format.ParseError as e:
        raise ValueError(f"{path}: not a TF Serving model config ({e})") from e
    entries = config.model_config_list.config
    if not entries:
        raise ValueError(f"{path}: lists no model (model_config_list {{ config {{ name ... base_path ... }} }})")
    models = {}
    for entry in entries:
        if not entry.name or not entry.base_path:
            raise ValueError(f"{path}: every config needs a name and a base_path")
        if entry.name in models:
            raise ValueError(f"{path}: model {entry.name!r} is listed twice")
        base = entry.base_path
        if base.startswith(CONTAINER_ROOT):
            root = os.path.dirname(os.path.abspath(path))
            base = os.path.normpath(os.path.join(root, base[len(CONTAINER_ROOT):]))
            if os.path.commonpath([root, base]) != root:
                raise ValueError(f"{path}: model {entry.name!r}: base_path {entry.base_path!r} leaves the "
                                 "mounted directory")
        models[entry.name] = base
    return models


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """What the stand-in reads of a TF Serving batching parameters file (its other
    fields, `num_batch_threads` and `max_enqueued_batches`, are TF Serving's only:
    the stand-in runs one batch of a model at a time)."""

    max_batch_size: int = MAX_BATCH_SIZE
    pad_variable_length_inputs: bool = True
    batch_timeout_micros: int = 1000


def read_batching_parameters(path: str) -> BatchingParameters:
    """`max_batch_size`, `pad_variable_length_inputs` and `batch_timeout_micros` of a
    TF Serving batching parameters file (text `BatchingParameters`, as
    `serving.export` writes it); a field left out has TF Serving's default (no
    padding, no wait for a fuller batch)."""
    with open(path) as f:
        text = f.read()
    match = re.search(r"\bmax_batch_size\s*\{\s*value\s*:\s*(\d+)\s*\}", text)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"{path}: no max_batch_size {{ value: N }} (a TF Serving batching parameters file)")
    pad = re.search(r"\bpad_variable_length_inputs\s*:\s*(\w+)", text)
    timeout = re.search(r"\bbatch_timeout_micros\s*\{\s*value\s*:\s*(\d+)\s*\}", text)
    return BatchingParameters(int(match.group(1)), pad is not None and pad.group(1) == "true",
                              int(timeout.group(1)) if timeout else 0)
