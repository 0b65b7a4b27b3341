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

The ranker's export (`dare_tf.export.ranker`) answers these signatures:

- `serving_default` (Predict): int64 `target_item`, `target_category` `[B]`
  and `hist_items`, `hist_categories` `[B, T]`: each row a leading column of
  `-T` (the request's own width, above), then RAW ids, oldest
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
  Serving's batcher merges across users (above): int64 raw
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
"""

import os
import re

import numpy as np

from dare_tf.data.storage.schema import CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS

SERVING_DEFAULT = "serving_default"
# The ranker's tf.Example signatures (TF Serving's Classify and Regress APIs).
CLASSIFY = "classify"
REGRESS = "regress"
# The SignatureDef method names TF Serving dispatches its three APIs on.
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# Every export's signature of raw item ids -> known, id_maps (its id maps' digest).
DATASET_SIGNATURE = "dataset"
EXPLAIN = "explain"
RANK = "rank"
# The ranker's raw item and category ids of clicks -> whether its id maps know each (`item_known`,
# `category_known`): a click the models have no row for, said as such (`recommend`, the page).
VOCABULARY = "vocabulary"
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
# The retrieval export's `sources` output: what placed each candidate, one of its sources
# (`dare_tf.retrieval.candidates`), the filler (no source proposed it) or the user's own clicks.
CANDIDATE_SOURCES = ("two_tower", "popularity", "recent_categories")
CANDIDATE_ORIGINS = (*CANDIDATE_SOURCES, "filler", "seen")
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
