"""TensorFlow Serving conventions that the exports, the client and the stand-in
share: signature names, the inputs of the user-major `rank` signature and the
batching limit. Plain Python: importing it loads neither TensorFlow nor Keras.

`rank` (and `rank_explain`) take one row per user, so that TF Serving's batcher,
which concatenates requests along the first dimension of every input, can merge
the requests of different users:

| input | shape | meaning |
|---|---|---|
| `hist_items`, `hist_categories` | `[U, T]` int64 | `-T`, then raw ids, oldest first |
| `hist_length` | `[U]` int64 | how many ids after the leading column are the history |
| `candidate_items`, `candidate_categories` | `[U, N]` int64 | `-N`, then raw ids |
| `candidate_count` | `[U]` int64 | how many candidates after the leading column are real |

Every `[U, T]` and `[U, N]` row starts with a leading column holding minus the
request's own width (`-T`, `-N`; `serving.client` writes it), the ids after it:
the history is the `hist_length` ids after that column, the candidates the
`candidate_count` after it. `serving_default` and `explain` take the same
leading column in every `[B, T]` history input. Outputs: `probability`
`[U, N]` (0 beyond `candidate_count`) and `error` `[U]`, a row's own refusal
("" for a row that was answered; its probabilities are then 0).

With `pad_variable_length_inputs`, TF Serving pads a shorter input after its
elements with that tensor's first element, its leading `-T`: every merged row
still states the width it was sent with, so the signature never reads a
padded slot, sees a companion input narrower than its ids, or a length longer
than its row, whatever the row is merged with; and no check of a row's values
fails the batch (`dare_tf.export.rows`). A request's answer, or its error,
depends on that request alone.
"""

import os
import re

import numpy as np

from dare_tf.data.storage.schema import CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS

SERVING_DEFAULT = "serving_default"
# Every export's signature of raw item ids -> known, id_maps (its id maps' digest).
DATASET_SIGNATURE = "dataset"
EXPLAIN = "explain"
RANK = "rank"
# A ranker with further fields: raw item ids -> each column field's raw value (a candidate's `candidate_<name>`).
ITEM_FIELDS = "item_fields"
RANK_EXPLAIN = "rank_explain"
HIST_LENGTH = "hist_length"
# The per-row refusal every history-taking Predict signature of the ranker returns ("" for none).
ROW_ERROR = "error"
CANDIDATE_COUNT = "candidate_count"
# `rank`'s inputs, in order, with their ranks.
RANK_REQUEST_INPUTS = {HIST_ITEMS: 2, HIST_CATEGORIES: 2, HIST_LENGTH: 1, CANDIDATE_ITEMS: 2, CANDIDATE_CATEGORIES: 2,
               CANDIDATE_COUNT: 1}
# Rows (first-dimension entries) of one request and of one merged batch: the
# exported batching_parameters.txt's max_batch_size and the stand-in's default.
MAX_BATCH_SIZE = 256
# Candidates per user a `rank` request may carry (serving.export --max_candidates).
MAX_CANDIDATES = 1000


def with_width_column(values: np.ndarray) -> np.ndarray:
    """`[rows, T]` int64 values behind the leading column of minus the request's
    width (`-(T + 1)`, the column counted), as every 2-D input row of the ranker's
    signatures starts; string ids (`--string_ids`, an object array) behind that
    number as text."""
    values = np.asarray(values)
    if values.dtype != object:
        values = values.astype(np.int64)
    width = -(values.shape[1] + 1)
    return np.concatenate([np.full((len(values), 1), str(width) if values.dtype == object else width,
                                   values.dtype), values], axis=1)


def versions(model_base: str) -> list[int]:
    """The numeric version directories TF Serving would load from `model_base`."""
    if not os.path.isdir(model_base):
        return []
    return sorted(int(d) for d in os.listdir(model_base) if re.fullmatch(r"\d+", d))
