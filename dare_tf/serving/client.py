"""Client of a served DARE-family model: gRPC (tensorflow-serving-api) and REST.

Library:
    client = ServingClient("localhost:8500", "dare")
    client.predict([item], [category], [[h1, h2, ...]], [[c1, c2, ...]])["probability"]

Command line: `python -m serving.client` (serving/client.py).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Sequence

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)

from dare_tf._faces import public
from dare_tf.data.storage.schema import (CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS,
    MODEL_INPUTS, TARGET_CATEGORY, TARGET_ITEM)
from dare_tf.signatures import (CANDIDATE_COUNT, EXPLAIN, HIST_LENGTH, RANK, RANK_EXPLAIN, ROW_ERROR, SERVING_DEFAULT,
                                with_width_column)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


def as_ids(name: str, values) -> np.ndarray:
    """`values` as an int64 array, or string ids (`--string_ids`: every value a
    `str`) as an object array of them; refuses other values (1.5, True, ints
    mixed with strings) and ids outside the int64 range instead of truncating
    them."""
    array = np.asarray(values, object if _all_strings(values) else None)
    if array.size == 0:  # (an empty list reads as float64; an empty object array: string ids)
        return array if array.dtype == object else array.astype(np.int64)
    if array.dtype == object and all(isinstance(v, str) for v in np.ravel(array)):
        return array
    if array.dtype == object or array.dtype.kind not in "iu":
        bad = next((v for v in np.ravel(array) if isinstance(v, bool) or not isinstance(v, (int, np.integer))),
                   None)
        if bad is not None or array.dtype.kind not in "iuO":
            raise ValueError(f"{name}: ids must be integers, got {bad if bad is not None else array.dtype}")
    try:
        return array.astype(np.int64) if array.dtype != object else np.array(array.tolist(), np.int64)
    except OverflowError as e:
        raise ValueError(f"{name}: an id is outside the int64 range ({e})") from e


def _all_strings(values) -> bool:
    flat = np.ravel(np.asarray(values, object)) if not isinstance(values, np.ndarray) else np.ravel(values)
    return len(flat) > 0 and all(isinstance(v, (str, np.str_)) for v in flat)


def _blank(rows: list, shape) -> np.ndarray:
    """Padding for `rows` of ids: 0, or "" for string ids."""
    strings = any(r.dtype == object for r in rows)
    return np.full(shape, "", object) if strings else np.zeros(shape, np.int64)


@public("dare_tf.serving")
def pad_histories(histories: Sequence[Sequence[int]], name: str = HIST_ITEMS) -> np.ndarray:
    """Variable-length histories (oldest first) -> int64 `[B, T]`: each row's
    leading column minus the width T (`dare_tf.signatures`), then its ids
    right-aligned behind 0s (padding): TF Serving's batcher pads a request
    merged with a longer one with that leading `-T`, which `serving_default`
    reads as the row's own width."""
    rows = [as_ids(f"{name}[{i}]", h).reshape(-1) for i, h in enumerate(histories)]
    out = _blank(rows, (len(rows), max((len(h) for h in rows), default=0)))
    for row, history in enumerate(rows):
        if len(history):
            out[row, out.shape[1] - len(history):] = history
    return with_width_column(out)


def left_aligned(rows: Sequence[Sequence[int]], name: str) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length rows -> int64 `[U, 1 + longest]`, each row's leading column
    minus the width, then its ids (padding 0 after them), and each row's length
    `[U]`: the `rank` signature's layout (`dare_tf.signatures`)."""
    rows = [as_ids(f"{name}[{i}]", r).reshape(-1) for i, r in enumerate(rows)]
    lengths = np.array([len(r) for r in rows], np.int64)
    out = _blank(rows, (len(rows), int(lengths.max(initial=0))))
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return with_width_column(out), lengths


def row_errors(signature: str, outputs: dict) -> dict:
    """`outputs` of a ranker's signature without its per-row `error`; raises
    ValueError naming the first row the server refused and why."""
    if ROW_ERROR not in outputs:
        return outputs
    errors = np.asarray(outputs[ROW_ERROR]).reshape(-1)
    for row, error in enumerate(errors):
        if len(error):
            message = error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)
            raise ValueError(f"{signature}: row {row} of the request was refused: {message}")
    return {k: v for k, v in outputs.items() if k != ROW_ERROR}


def in_own_history(out: dict, inputs: dict, hist_items) -> dict:
    """An `explain` answer to a `request_tensors` request with its `history_index` made
    an index into each user's own history list (the request left-pads them)."""
    shift = inputs[HIST_ITEMS].shape[1] - np.array([len(h) for h in hist_items])[:, None]
    index = out["history_index"]
    return dict(out, history_index=np.where(index >= 0, index - shift, -1))


def _field_kind(name: str) -> str:
    """`hist`, `target` or `candidate`: the role of a further field's input name."""
    role = name.split("_", 1)[0]
    if role not in ("hist", "target", "candidate") or "_" not in name:
        raise ValueError(f"fields: {name!r} is not a field input (hist_<field>, target_<field> or "
                         "candidate_<field>)")
    return role


def rank_tensors(hist_items, hist_categories, candidate_items, candidate_categories,
                 fields: dict | None = None) -> dict[str, np.ndarray]:
    """The `rank` signature's inputs for U users: per user a history (raw ids,
    oldest first) and a candidate list, each of any length; `fields`: a model's
    further fields by input name (`hist_<field>`: per user, one value per
    history id; `candidate_<field>`: one per candidate)."""
    if not len(hist_items) == len(hist_categories) == len(candidate_items) == len(candidate_categories):
        raise ValueError(f"rank: one history and one candidate list per user; got {len(hist_items)} hist_items, "
                         f"{len(hist_categories)} hist_categories, {len(candidate_items)} candidate_items and "
                         f"{len(candidate_categories)} candidate_categories")
    out = {}
    values = {HIST_ITEMS: hist_items, HIST_CATEGORIES: hist_categories, CANDIDATE_ITEMS: candidate_items,
              CANDIDATE_CATEGORIES: candidate_categories}
    for ids, categories, length in ((HIST_ITEMS, HIST_CATEGORIES, HIST_LENGTH),
                                    (CANDIDATE_ITEMS, CANDIDATE_CATEGORIES, CANDIDATE_COUNT)):
        out[ids], lengths = left_aligned(values[ids], ids)
        out[categories], other = left_aligned(values[categories], categories)
        if (lengths != other).any():
            user = int(np.flatnonzero(lengths != other)[0])
            raise ValueError(f"rank: user {user} has {lengths[user]} {ids} but {other[user]} {categories}")
        out[length] = lengths
    for name, rows in (fields or {}).items():
        role = _field_kind(name)
        if role == "target" or len(rows) != len(hist_items):
            raise ValueError(f"rank: fields[{name!r}]: expected hist_<field> or candidate_<field> with one row per "
                             f"user ({len(hist_items)})")
        out[name], lengths = left_aligned(rows, name)
        count = out[HIST_LENGTH if role == "hist" else CANDIDATE_COUNT]
        if (lengths != count).any():
            user = int(np.flatnonzero(lengths != count)[0])
            ids = HIST_ITEMS if role == "hist" else CANDIDATE_ITEMS
            raise ValueError(f"rank: user {user} has {count[user]} {ids} but {lengths[user]} {name}")
    return out


def rank_results(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A `rank` (or `rank_explain`) answer per user, cut to that user's candidates
    (TF Serving returns a merged batch's padded width); raises ValueError for a
    row the server refused (`row_errors`)."""
    outputs = row_errors(RANK, outputs)
    return [{name: value[user, :inputs[CANDIDATE_COUNT][user]] for name, value in outputs.items()}
            for user in range(len(inputs[CANDIDATE_COUNT]))]


@public("dare_tf.serving")
def make_example(target_item: int, target_category: int, hist_items: Sequence[int],
                 hist_categories: Sequence[int], fields: dict | None = None) -> tf.train.Example:
    """The tf.Example the `classify` and `regress` signatures parse (`fields`: a
    model's further fields by input name, `target_<field>` a value and
    `hist_<field>` a list beside `hist_items`)."""
    values = dict(zip(MODEL_INPUTS, ([target_item], [target_category], hist_items, hist_categories)))
    values.update({k: [v] if _field_kind(k) == "target" else v for k, v in (fields or {}).items()})
    def feature(name, v):
        ids = as_ids(name, v).reshape(-1)
        if ids.dtype == object:  # (string ids)
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[i.encode() for i in ids]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=ids.tolist()))

    return tf.train.Example(features=tf.train.Features(feature={name: feature(name, v) for name, v in values.items()}))


def request_tensors(target_items, target_categories, hist_items, hist_categories,
                    fields: dict | None = None) -> dict[str, np.ndarray]:
    """The serving signature's input arrays for a batch of users (histories of any
    lengths); `fields`: a model's further fields by input name (`target_<field>`
    one value per target, `hist_<field>` one list per history, as long as it)."""
    out = {TARGET_ITEM: as_ids(TARGET_ITEM, target_items).reshape(-1),
           TARGET_CATEGORY: as_ids(TARGET_CATEGORY, target_categories).reshape(-1),
           HIST_ITEMS: pad_histories(hist_items, HIST_ITEMS),
           HIST_CATEGORIES: pad_histories(hist_categories, HIST_CATEGORIES)}
    for name, values in (fields or {}).items():
        if _field_kind(name) == "target":
            out[name] = as_ids(name, values).reshape(-1)
        elif _field_kind(name) == "hist":
            lengths = [len(h) for h in hist_items]
            other = [len(v) for v in values]
            if other != lengths:
                row = next((i for i, (a, b) in enumerate(zip(lengths, other)) if a != b), min(len(lengths),
                                                                                            len(other)))
                raise ValueError(f"fields[{name!r}]: one list per history, as long as it (row {row}: "
                                 f"{other[row] if row < len(other) else 'none'} values for "
                                 f"{lengths[row] if row < len(lengths) else 'no'} hist_items)")
            out[name] = pad_histories(values, name)
        else:
            raise ValueError(f"fields[{name!r}]: candidate_<field> inputs are rank's; predict takes target_<field>")
    return out


@public("dare_tf.serving")
def explained_behaviours(history_index, attention_weight, hist_items, hist_categories) -> list[dict]:
    """One target's retrieved behaviours in the request's terms, heaviest first: the
    raw `item` and `category` of each, how many clicks before the target it was
    (`clicks_ago`, 1 = the most recent) and its attention `weight`.
    `history_index`, `attention_weight`: the `explain` signature's row for the
    target; the histories: the ones the request sent (oldest first)."""
    hist_items, hist_categories = np.asarray(hist_items).reshape(-1), np.asarray(hist_categories).reshape(-1)
    index, weight = np.asarray(history_index), np.asarray(attention_weight)
    keep = np.flatnonzero(index >= 0)
    keep = keep[np.argsort(-weight[keep], kind="stable")]
    return [{"item": int(hist_items[index[k]]), "category": int(hist_categories[index[k]]),
             "clicks_ago": int(len(hist_items) - index[k]), "weight": float(weight[k])} for k in keep]


@public("dare_tf.serving")
def format_explanation(behaviours: list[dict]) -> str:
    """`explained_behaviours` as a markdown table."""
    lines = ["| rank | behaviour item | category | clicks ago | weight |", "|---|---|---|---|---|"]
    lines += [f"| {rank} | {b['item']} | {b['category']} | {b['clicks_ago']} | {b['weight']:.4f} |"
              for rank, b in enumerate(behaviours, start=1)]
    return "\n".join(lines)


@public("dare_tf.serving")
class ServingClient:
    """gRPC client of TF Serving's PredictionService for one model.

    Args:
        target: `host:port` of the gRPC endpoint.
        model_name: the served model's name.
        timeout: seconds per call.
        retries: extra attempts after UNAVAILABLE, with exponential backoff.
        backoff: seconds before the first retry.
        version: a model version to pin (None: the latest).
    """

    def __init__(self, target: str, model_name: str, timeout: float = 5.0, retries: int = 3,
                 backoff: float = 0.1, version: int | None = None):
        self.model_name, self.timeout, self.retries, self.backoff, self.version = (
            model_name, timeout, retries, backoff, version)
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
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
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        response = self._call(self.stub.Predict, request)
        return row_errors(signature, {k: tf.make_ndarray(v) for k, v in response.outputs.items()})

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

    def classify(self, examples: Sequence[tf.train.Example], signature: str = "classify") -> np.ndarray:
        """Scores `[B, 2]` (no click, click) through the Classify API."""
        request = classification_pb2.ClassificationRequest()
        self._spec(request.model_spec, signature)
        self._input(request, examples)
        response = self._call(self.stub.Classify, request)
        return np.array([[c.score for c in row.classes] for row in response.result.classifications])

    def regress(self, examples: Sequence[tf.train.Example], signature: str = "regress") -> np.ndarray:
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
        describe = lambda m: {k: tf.dtypes.as_dtype(v.dtype).name for k, v in m.items()}  # noqa: E731
        return {"model": response.model_spec.name, "version": int(response.model_spec.version.value),
                "signatures": {name: {"method": d.method_name, "inputs": describe(d.inputs),
                                      "outputs": describe(d.outputs)}
                               for name, d in signatures.signature_def.items()}}


@public("dare_tf.serving")
def rest_predict(base_url: str, model_name: str, inputs: dict, signature: str = SERVING_DEFAULT,
                 timeout: float = 5.0) -> dict:
    """TF Serving REST predict (columnar `inputs` format); returns the `outputs` dict."""
    body = json.dumps({"signature_name": signature,
                       "inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()}}).encode()
    request = urllib.request.Request(f"{base_url.rstrip('/')}/v1/models/{model_name}:predict", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as e:  # (a ValueError: the programs end it in one line)
        raise ValueError(f"{base_url}: REST predict failed (HTTP {e.code}): "
                         f"{e.read().decode(errors='replace')[:500]}") from e
    except urllib.error.URLError as e:
        raise ValueError(f"{base_url}: no REST server answers ({e.reason})") from e
    try:
        outputs = json.loads(payload)["outputs"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{base_url}: not a TF Serving REST answer ({payload[:200]!r})") from e
    return row_errors(signature, outputs) if isinstance(outputs, dict) else outputs
