"""The stand-in's served versions: one SavedModel version loaded with its
signature definitions and request checks (`LoadedModel`), and the watch that
switches a model to its newest version (`watch_versions`), as TF Serving's
`latest` version policy does."""

from __future__ import annotations

import os
import threading

import grpc
import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import saved_model_pb2

from dare_tf.signatures import SERVING_DEFAULT, versions
from dare_tf.testing.batcher import Batcher
from dare_tf.testing.requests import ServingError


def latest_version(model_base: str) -> int:
    found = versions(model_base)
    if not found:
        raise FileNotFoundError(f"{model_base}: no numeric version directory")
    return found[-1]


class LoadedModel:
    """One SavedModel version and its signature definitions."""

    def __init__(self, model_base: str, model_name: str, version: int | None = None):
        self.name = model_name
        self.version = latest_version(model_base) if version is None else version
        path = os.path.join(model_base, str(self.version))
        self.module = tf.saved_model.load(path)
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        self.signature_defs = {k: v for k, v in proto.meta_graphs[0].signature_def.items()
                               if not k.startswith("__")}
        self.lock = threading.Lock()
        self.batcher: Batcher | None = None  # its own (`PredictionService`), so a request keeps the pair

    def signature(self, model_spec, method: str):
        if model_spec.name != self.name:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {model_spec.name}")
        if model_spec.HasField("version") and model_spec.version.value != self.version:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Servable not found: {model_spec.name} version {model_spec.version.value}")
        name = model_spec.signature_name or SERVING_DEFAULT
        if name not in self.signature_defs:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Serving signature key \"{name}\" not found.")
        definition = self.signature_defs[name]
        if definition.method_name != method:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Expected {method} signature method_name, got {definition.method_name}")
        return name, definition

    def run(self, name: str, definition, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = set(definition.inputs)
        if set(inputs) != expected:
            missing, extra = sorted(expected - set(inputs)), sorted(set(inputs) - expected)
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "the request's inputs do not match signature "
                               f"{name!r}: " + "; ".join(
                                   [f"missing {', '.join(missing)}"] * bool(missing)
                                   + [f"not in the signature: {', '.join(extra)}"] * bool(extra))
                               + f" (it takes {', '.join(sorted(expected))})")
        feed = {}
        for key, value in inputs.items():
            want = tf.dtypes.as_dtype(definition.inputs[key].dtype)
            if value.dtype != want.as_numpy_dtype and not (want == tf.string and value.dtype == object):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"Expects arg[{key}] to be {want.name} but {tf.as_dtype(value.dtype).name} "
                                   "is provided")
            feed[key] = tf.constant(value, want)
        try:
            outputs = self.module.signatures[name](**feed)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            message = " ".join(getattr(e, "message", str(e)).split())
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, message[:2000]) from e
        return {k: v.numpy() for k, v in outputs.items()}


def watch_versions(service, bases: dict[str, str], poll_s: float) -> threading.Event:
    """Every `poll_s` seconds, serves each model's newest version under its base path
    once one appears (`PredictionService.switch`); a version directory appears whole
    (the export renames it into place). A version that does not load (a copy in
    progress, a broken file) is logged and tried again at every poll, while the
    model's current version goes on serving and the other models are watched, as
    TF Serving does. Returns the event that stops the watch."""
    stop = threading.Event()
    failed: dict[tuple[str, int], str] = {}  # (model, version) -> why it did not load, logged once

    def loop():
        while not stop.wait(poll_s):
            for name, base in bases.items():
                found = versions(base)
                if not found or found[-1] <= service.models[name].version:
                    continue
                try:
                    service.switch(LoadedModel(base, name, found[-1]))
                except Exception as e:  # noqa: BLE001 (a version that does not load: the others go on)
                    why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                    if failed.get((name, found[-1])) != why:
                        failed[(name, found[-1])] = why
                        logging.error("model %s: version %d under %s did not load (%s); still serving "
                                      "version %d, and trying again every %g s", name, found[-1], base, why,
                                      service.models[name].version, poll_s)

    threading.Thread(target=loop, daemon=True, name="version-watch").start()
    return stop
