"""dare_tf.testing.batcher: requests merged within the batch timeout, as TF Serving's
batch_timeout_micros merges them (merging and padding of merged rows:
tests/export/test_rank.py)."""

import threading
import time

import numpy as np

from dare_tf.testing.batcher import Batcher


class _Recorder:
    def __init__(self):
        self.batches = []

    def run(self, name, definition, inputs):
        self.batches.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2}


def _two_requests(timeout_s: float, gap_s: float) -> tuple[list[int], list]:
    model = _Recorder()
    batcher = Batcher(model, max_batch_size=8, timeout_s=timeout_s)
    answers = [None, None]

    def send(i):
        answers[i] = batcher.run("serving_default", None, {"x": np.array([i + 1])})["y"].tolist()

    first = threading.Thread(target=send, args=(0,))
    first.start()
    time.sleep(gap_s)
    send(1)
    first.join()
    batcher.stop()
    return model.batches, answers


def test_a_request_within_the_timeout_joins_the_batch_and_a_later_one_does_not():
    batches, answers = _two_requests(timeout_s=0.5, gap_s=0.1)
    assert batches == [2] and answers == [[2], [4]]
    batches, answers = _two_requests(timeout_s=0.001, gap_s=0.3)
    assert batches == [1, 1] and answers == [[2], [4]]
