"""gRPC client of a served DARE-family model (TF Serving's PredictionService,
through tensorflow-serving-api's protos, loaded without TensorFlow's runtime by
`dare_tf.serving.protos`): `predict`,
`explain`, `rank`, Classify, Regress and the model's metadata. The request
tensors and the answers are `dare_tf.serving.encoding`'s; the REST transport is
`dare_tf.serving.rest`.

Library:
    client = ServingClient("localhost:8500", "dare")
    client.predict([item], [category], [[h1, h2, ...]], [[c1, c2, ...]])["probability"]

Command line: `python -m serving.client` (serving/client.py).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Sequence

import grpc
import numpy as np

from dare_tf._faces import public
from dare_tf.serving import protos
from dare_tf.serving.protos import (classification_pb2, example_pb2, feature_pb2, get_model_metadata_pb2, predict_pb2,
                                    prediction_service_pb2_grpc, regression_pb2)
from dare_tf.data.storage.schema import MODEL_INPUTS, input_role
from dare_tf.ids import as_ids
from dare_tf.serving.encoding import in_own_history, rank_results, rank_tensors, request_tensors, row_errors
from dare_tf.signatures import (CLASSIFY, DATASET_SIGNATURE, EXPLAIN, RANK, RANK_EXPLAIN, REGRESS, SERVING_DEFAULT,
                                versions)

# Retried: every call of this client is a read (Predict, Classify, Regress, GetModelMetadata), so a
# call that failed UNAVAILABLE (no server reached, or the one reached died) cannot answer twice if
# sent again; any other status (DEADLINE_EXCEEDED included: the server may still be working) is not.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
# Between connection attempts to a server that went away (gRPC's default starts at 1 s and grows to
# 120 s): a restarted replica takes traffic again within a second.
RECONNECT_MS = {"grpc.initial_reconnect_backoff_ms": 100, "grpc.min_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": 1000}


@public("dare_tf.serving")
def channel_target(servers: str) -> tuple[str, list[tuple[str, object]]]:
    """The gRPC target and channel options of `servers`: `HOST:PORT`, or several
    `HOST:PORT,HOST:PORT,...` (replicas of one model server), each host resolved
    once to its address, balanced by gRPC's `round_robin` policy (a server that
    stops answering is left out until it answers again)."""
    import socket

    entries = [entry.strip() for entry in servers.split(",")]
    for entry in entries:  # (before gRPC sees them: it would log C-core errors, then fail)
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"--server={servers!r}: {entry!r} is not HOST:PORT (a port from 1 to 65535)")
    options = [("grpc.max_receive_message_length", 64 << 20), *RECONNECT_MS.items()]
    if len(entries) == 1:
        return entries[0], options
    addresses = []
    for entry in entries:
        host, _, port = entry.rpartition(":")
        try:
            family, *_, address = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
        except socket.gaierror as e:
            raise ValueError(f"--server={servers!r}: {host!r} does not resolve ({e})") from None
        addresses.append((family, address))
    if len({family for family, _ in addresses}) > 1:
        raise ValueError(f"--server={servers!r}: mixes IPv4 and IPv6 addresses; give one kind")
    v6 = addresses[0][0] == socket.AF_INET6
    target = ("ipv6:" if v6 else "ipv4:") + ",".join(f"[{a[0]}]:{a[1]}" if v6 else f"{a[0]}:{a[1]}"
                                                      for _, a in addresses)
    return target, [*options, ("grpc.lb_policy_name", "round_robin")]


@public("dare_tf.serving")
def make_example(target_item: int, target_category: int, hist_items: Sequence[int],
                 hist_categories: Sequence[int], fields: dict | None = None) -> example_pb2.Example:
    """The tf.Example the `classify` and `regress` signatures parse (`fields`: a
    model's further fields by input name, `target_<field>` a value and
    `hist_<field>` a list beside `hist_items`)."""
    values = dict(zip(MODEL_INPUTS, ([target_item], [target_category], hist_items, hist_categories)))
    values.update({k: [v] if input_role(k) == "target" else v for k, v in (fields or {}).items()})
    def feature(name, v):
        ids = as_ids(name, v).reshape(-1)
        if ids.dtype == object:  # (string ids)
            return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[i.encode() for i in ids]))
        return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=ids.tolist()))

    return example_pb2.Example(features=feature_pb2.Features(
        feature={name: feature(name, v) for name, v in values.items()}))


@public("dare_tf.serving")
class ServingClient:
    """gRPC client of TF Serving's PredictionService for one model.

    Args:
        target: `host:port` of the gRPC endpoint, or several (`h1:p1,h2:p2`:
            replicas, balanced round robin; `channel_target`).
        model_name: the served model's name.
        timeout: seconds per call.
        retries: extra attempts after UNAVAILABLE (`RETRYABLE`), with exponential
            backoff; with several servers the next attempt goes to another.
        backoff: seconds before the first retry.
        version: a model version to pin (None: the latest).
    """

    def __init__(self, target: str, model_name: str, timeout: float = 5.0, retries: int = 3,
                 backoff: float = 0.1, version: int | None = None):
        self.model_name, self.timeout, self.retries, self.backoff, self.version = (
            model_name, timeout, retries, backoff, version)
        target, options = channel_target(target)
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def _spec(self, spec, signature_name: str = "") -> None:
        spec.name = self.model_name
        if signature_name:
            spec.signature_name = signature_name
        if self.version is not None:
            spec.version.value = self.version

    def _call(self, method, request):
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self.timeout)
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE or attempt == self.retries:
                    raise
                time.sleep(delay)
                delay *= 2

    def predict_tensors(self, inputs: dict[str, np.ndarray], signature: str = SERVING_DEFAULT) -> dict:
        """Predict with ready-made input arrays; returns the outputs as numpy arrays."""
        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec, signature)
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(protos.tensor_proto(value))
        response = self._call(self.stub.Predict, request)
        return row_errors(signature, {k: protos.to_array(v) for k, v in response.outputs.items()})

    def predict(self, target_items, target_categories, hist_items, hist_categories,
                signature: str = SERVING_DEFAULT, fields: dict | None = None) -> dict:
        """Many users in one request: histories may have different lengths
        (`fields`: a model's further fields by input name, `request_tensors`)."""
        return self.predict_tensors(request_tensors(target_items, target_categories, hist_items,
                                                    hist_categories, fields), signature)

    def explain(self, target_items, target_categories, hist_items, hist_categories,
                fields: dict | None = None) -> dict:
        """`probability`, `attention_weight` `[B, K]` and `history_index` `[B, K]`:
        the index of each retrieved behaviour in that user's own history list
        (-1 for none)."""
        inputs = request_tensors(target_items, target_categories, hist_items, hist_categories, fields)
        return in_own_history(self.predict_tensors(inputs, signature=EXPLAIN), inputs, hist_items)

    def rank(self, hist_items, hist_categories, candidate_items, candidate_categories,
             explain: bool = False, fields: dict | None = None) -> list[dict[str, np.ndarray]]:
        """User-major ranking (the `rank` signature): per user a history (raw ids,
        oldest first) and its candidates, any lengths, in one request; returns per
        user `probability` `[N_u]` (with `explain`, also `history_index` `[N_u, K]`,
        the index into that user's history, -1 for none, and `attention_weight`).
        `fields`: a model's further fields by input name (`rank_tensors`)."""
        inputs = rank_tensors(hist_items, hist_categories, candidate_items, candidate_categories, fields)
        return rank_results(inputs, self.predict_tensors(inputs, RANK_EXPLAIN if explain else RANK))

    def _input(self, request, examples):
        for example in examples:
            request.input.example_list.examples.add().CopyFrom(example)

    def classify(self, examples: Sequence[example_pb2.Example], signature: str = CLASSIFY) -> np.ndarray:
        """Scores `[B, 2]` (no click, click) through the Classify API."""
        request = classification_pb2.ClassificationRequest()
        self._spec(request.model_spec, signature)
        self._input(request, examples)
        response = self._call(self.stub.Classify, request)
        return np.array([[c.score for c in row.classes] for row in response.result.classifications])

    def regress(self, examples: Sequence[example_pb2.Example], signature: str = REGRESS) -> np.ndarray:
        """Click probabilities `[B]` through the Regress API."""
        request = regression_pb2.RegressionRequest()
        self._spec(request.model_spec, signature)
        self._input(request, examples)
        response = self._call(self.stub.Regress, request)
        return np.array([r.value for r in response.result.regressions])

    def _metadata(self):
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(request.model_spec)
        request.metadata_field.append("signature_def")
        return self._call(self.stub.GetModelMetadata, request)

    def served_version(self) -> int:
        """The version of the model that answers now (the latest, unless pinned):
        after an export, the new version once the server switched to it."""
        return int(self._metadata().model_spec.version.value)

    def metadata(self) -> dict:
        """What answers now: `model` (the name), `version` (the served version: after
        an export, the new one once the server switched to it) and `signatures`,
        signature name -> {method, inputs: {name: dtype}, outputs: {name: dtype}}."""
        response = self._metadata()
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        describe = lambda m: {k: protos.dtype_name(v.dtype) for k, v in m.items()}  # noqa: E731
        return {"model": response.model_spec.name, "version": int(response.model_spec.version.value),
                "signatures": {name: {"method": d.method_name, "inputs": describe(d.inputs),
                                      "outputs": describe(d.outputs)}
                               for name, d in signatures.signature_def.items()}}


@public("dare_tf.serving")
class LocalModel:
    """An exported SavedModel loaded in this process, with the client's
    `predict_tensors`: `path` is a version directory or a model base (its
    latest version)."""

    def __init__(self, path: str, model_name: str | None = None):
        found = versions(path)
        self.path = os.path.join(path, str(found[-1])) if found else path
        if not os.path.exists(os.path.join(self.path, "saved_model.pb")):
            raise FileNotFoundError(f"{path}: neither a SavedModel nor a directory of numeric versions")
        self.model_name = model_name or os.path.basename(os.path.dirname(self.path) if found else self.path)
        import tensorflow as tf

        self.module = tf.saved_model.load(self.path)

    def predict_tensors(self, inputs: dict[str, np.ndarray], signature: str = SERVING_DEFAULT) -> dict:
        import tensorflow as tf

        if signature not in self.module.signatures:
            raise ValueError(f"{self.path}: no signature {signature!r} (has {sorted(self.module.signatures)})")
        function = self.module.signatures[signature]
        outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
        return row_errors(signature, {k: v.numpy() for k, v in outputs.items()})


def refusals() -> tuple[type[BaseException], ...]:
    """What a model's `predict_tensors` raises for a request it refuses: a server's
    gRPC status, a malformed input, and where TensorFlow is loaded (a `LocalModel`)
    its InvalidArgumentError (not importing TensorFlow where it is not)."""
    tf = sys.modules.get("tensorflow")
    return (grpc.RpcError, TypeError, ValueError) + ((tf.errors.InvalidArgumentError,) if tf is not None else ())


def dataset_of(model, role: str) -> dict:
    """What an export reports through its `dataset` signature: `id_maps` (its
    id maps' digest), `fields` (a ranker's further fields, a list), `strings`
    (whether it takes string ids, `--string_ids`), `max_len` (a ranker's history
    length: the last this many behaviours of a request are what it reads; None from
    an export older than it) and `notes` (a ranker's run's warnings, a list)."""
    try:
        try:
            out = model.predict_tensors({"item_ids": np.zeros([1], np.int64)}, DATASET_SIGNATURE)
            strings = False
        except refusals() as e:
            if "string" not in (e.details() if isinstance(e, grpc.RpcError) else str(e)):
                raise
            # An export of string ids (`--string_ids`) takes its ids as strings.
            out, strings = model.predict_tensors({"item_ids": np.array([""], object)}, DATASET_SIGNATURE), True
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            raise ValueError(f"the {role} model {model.model_name!r} is not served: {e.details()}") from e
        if e.code() == grpc.StatusCode.INVALID_ARGUMENT and DATASET_SIGNATURE in (e.details() or ""):
            raise ValueError(f"the {role} model {model.model_name!r} has no {DATASET_SIGNATURE!r} signature: "
                             "export it again with this version (python -m serving.export)") from e
        raise
    except ValueError as e:
        raise ValueError(f"the {role} model {model.model_name!r}: {e}; export it again with this version "
                         "(python -m serving.export)") from e
    fields = out["fields"][0].decode() if "fields" in out else ""
    notes = out["notes"][0].decode() if "notes" in out else ""
    return {"id_maps": out["id_maps"][0].decode(), "fields": fields.split(",") if fields else [], "strings": strings,
            "max_len": int(out["max_len"][0]) if "max_len" in out else None,
            "notes": notes.split("\n") if notes else []}

