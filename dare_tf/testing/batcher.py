"""The stand-in server's request batching, as TF Serving's `--enable_batching` does it."""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import numpy as np

from dare_tf.signatures import MAX_BATCH_SIZE
from dare_tf.testing.requests import ServingError


class Batcher:
    """Merges concurrent Predict requests into one call, as TF Serving's
    `--enable_batching` does (`batching_session.cc`, `batching_util.cc`):
    every input of a request needs the same first dimension (a request that
    shares one `[1, T]` history among its targets is refused, as TF
    Serving's batching session refuses it); requests of the same signature
    are concatenated along it (up to `max_batch_size` rows, waiting at most
    `timeout_s` for more), run once, and split back along it. Inputs whose
    other dimensions differ are padded, with `pad_variable_length_inputs`,
    AFTER their elements to the batch's largest with each tensor's own first
    element (an empty tensor among non-empty ones fails the batch), or fail
    the whole batch without it; outputs come back split along the first
    dimension only, with the batch's padded sizes."""

    def __init__(self, model, max_batch_size: int = MAX_BATCH_SIZE, timeout_s: float = 0.001,
                 pad_variable_length_inputs: bool = True):
        self.model, self.max_batch_size, self.timeout_s = model, max_batch_size, timeout_s
        self.pad = pad_variable_length_inputs
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        """Ends the batcher's thread once the requests queued before this call ran."""
        self.queue.put(None)

    @staticmethod
    def _key(name, inputs):
        sizes = {v.shape[0] if v.ndim else None for v in inputs.values()}
        if len(sizes) != 1 or None in sizes:
            return None  # not row-aligned
        return (name, tuple(sorted((k, v.ndim, v.dtype.str) for k, v in inputs.items())))

    def run(self, name, definition, inputs):
        key = self._key(name, inputs)
        if key is None:  # as TF Serving's batching session refuses it
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               "with batching, every input needs the same 0th-dimension size (send a history "
                               "per target, not one [1, T] history for all; or use the rank signature), or serve "
                               "without batching")
        done = futures.Future()
        self.queue.put((key, name, definition, inputs, done))
        return done.result()

    def _loop(self):
        while True:
            first = self.queue.get()
            if first is None:  # stop()
                return
            pending = [first]
            deadline = time.perf_counter() + self.timeout_s
            rows = next(iter(pending[0][3].values())).shape[0]
            while rows < self.max_batch_size:
                try:
                    item = self.queue.get(timeout=max(deadline - time.perf_counter(), 0))
                except queue.Empty:
                    break
                if item is None:  # stop() after these: run them, then end
                    self.queue.put(None)
                    break
                pending.append(item)
                rows += next(iter(item[3].values())).shape[0]
            groups: dict = {}
            for item in pending:
                groups.setdefault(item[0], []).append(item)
            for items in groups.values():
                self._run_group(items)

    def merged(self, requests: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The requests' inputs as TF Serving's batcher concatenates them (see the class)."""
        merged = {}
        for key in requests[0]:
            tensors = [r[key] for r in requests]
            widest = np.max([t.shape for t in tensors], axis=0)
            if any(tuple(t.shape[1:]) != tuple(widest[1:]) for t in tensors):
                if not self.pad:
                    raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, (
                        f"Tensors with name '{key}' from different tasks have different shapes and padding is "
                        "turned off. Set pad_variable_length_inputs to true, or ensure that all tensors with "
                        "the same name have equal dimensions starting with the first dim."))
                if any(t.size == 0 for t in tensors):
                    raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                       "Got empty tensor in batch of non-empty tensors.")
                tensors = [np.pad(t, [(0, 0)] + [(0, w - d) for w, d in zip(widest[1:], t.shape[1:])],
                                  constant_values=t.flat[0]) for t in tensors]
            merged[key] = np.concatenate(tensors)
        return merged

    def _run_group(self, items):
        _, name, definition, _, _ = items[0]
        sizes = [next(iter(it[3].values())).shape[0] for it in items]
        try:
            outputs = self.model.run(name, definition, self.merged([it[3] for it in items]))
        except Exception as e:  # noqa: BLE001 (every request of the group gets the error)
            for it in items:
                it[4].set_exception(e)
            return
        start = 0
        for it, size in zip(items, sizes):
            it[4].set_result({k: v[start: start + size] for k, v in outputs.items()})
            start += size
