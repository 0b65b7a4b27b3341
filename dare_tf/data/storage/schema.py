"""The names of every example's features and of the records on disk: the schema of
the model's inputs, the serving requests, the prepared TFRecords and the store,
and the names a further behaviour field (a brand, a seller, the time gap) adds
to each. Its only definition: the example writer, the reader, the model, the
serving signatures and the client all import it. Pure Python.
"""

from __future__ import annotations

from dare_tf._faces import public_names

# One example as the pipeline yields it: int32 scalars and int32 [L] histories
# (dense ids, 0 = padding, oldest first), assembled from the stored example
# (user, cut-off position, target, label) and its user's sequence in the store.
USER = "uid"
TARGET_ITEM = "target_item"
TARGET_CATEGORY = "target_category"
HIST_ITEMS = "hist_items"
HIST_CATEGORIES = "hist_categories"
LABEL = "label"
SCALAR_FEATURES = (USER, TARGET_ITEM, TARGET_CATEGORY, LABEL)
SEQUENCE_FEATURES = (HIST_ITEMS, HIST_CATEGORIES)
# What a model (and a serving request) takes, in this order.
MODEL_INPUTS = (TARGET_ITEM, TARGET_CATEGORY, HIST_ITEMS, HIST_CATEGORIES)
# User-major ranking (`DareModel.rank`, the export's `rank` signature): each user's
# one history `[U, L]` and that user's N candidates `[U, N]`.
CANDIDATE_ITEMS = "candidate_items"
CANDIDATE_CATEGORIES = "candidate_categories"
RANK_INPUTS = (HIST_ITEMS, HIST_CATEGORIES, CANDIDATE_ITEMS, CANDIDATE_CATEGORIES)

# What is on disk (`dare_tf.data.storage.spec`'s shards): TFRecord files of `tf.train.Example`s,
# all features int64.
# One record per example (the history is assembled from the store when read)...
EXAMPLE_COLUMNS = ("uid", "position", "target_item", "target_category", "label")
# ...and one record per stored user: its clicks in time order.
STORE_USER_COLUMNS = ("uid",)
STORE_CLICK_COLUMNS = ("items", "categories")
# Further fields of every behaviour (spec.json's `fields`, `dare_tf.data.storage.fields`): a
# field NAME read from a column adds the store list NAME and the example feature
# `target_NAME`; the derived time gap (`--time_gap`) adds the store list `times` and
# the example feature `time` (the target's time), from which the reader computes
# `hist_time_gap`.
TIME_GAP = "time_gap"
STORE_TIMES = "times"
EXAMPLE_TIME = "time"


def target_feature(name: str) -> str:
    """The example feature (and model input) of a field's target value."""
    return f"target_{name}"


def history_feature(name: str) -> str:
    """The model input of a field's history values."""
    return f"hist_{name}"


# The model input of the time gap: each behaviour's gap to the target's time.
HIST_TIME_GAP = history_feature(TIME_GAP)


def candidate_feature(name: str) -> str:
    """The `rank` input of a field's candidate values."""
    return f"candidate_{name}"


INPUT_ROLES = ("hist", "target", "candidate")


def input_role(name: str) -> str:
    """`hist`, `target` or `candidate`: the role of a field's input name (the
    inverse of `history_feature`, `target_feature` and `candidate_feature`)."""
    role = name.split("_", 1)[0]
    if role not in INPUT_ROLES or "_" not in name:
        raise ValueError(f"fields: {name!r} is not a field input (hist_<field>, target_<field> or "
                         "candidate_<field>)")
    return role


def record_columns(fields: list, store_times: bool = True) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The example record's features and the store record's lists of a dataset
    with spec.json's `fields`: `(EXAMPLE_COLUMNS + ..., STORE_CLICK_COLUMNS + ...)`.
    The store keeps every click's time (`STORE_TIMES`, last unless the time gap
    places it) unless `store_times` is False: a dataset prepared before it did
    kept them only with the time gap."""
    examples, store = list(EXAMPLE_COLUMNS), list(STORE_CLICK_COLUMNS)
    for field in fields:
        if field["name"] == TIME_GAP:
            examples.append(EXAMPLE_TIME)
            store.append(STORE_TIMES)
        else:
            examples += [target_feature(field["name"])] * (not field["history_only"])
            store.append(field["name"])
    if store_times and STORE_TIMES not in store:
        store.append(STORE_TIMES)
    return tuple(examples), tuple(store)


def features_of(fields: list, store_times: bool = True) -> dict:
    """spec.json's `features` of a dataset with `fields` (none: `[]`), for
    `tf.io.parse_example`: "[]" is a scalar (`tf.io.FixedLenFeature([], tf.int64)`),
    "[None]" a list (`tf.io.RaggedFeature(tf.int64)`); `store_times` as
    `record_columns`."""
    examples, store = record_columns(fields, store_times)
    return {"examples": {k: {"dtype": "int64", "shape": []} for k in examples},
            "store": {"uid": {"dtype": "int64", "shape": []}, **{k: {"dtype": "int64", "shape": [None]}
                                                                 for k in store}}}


public_names("dare_tf.data", "MODEL_INPUTS", "SCALAR_FEATURES", "SEQUENCE_FEATURES")
