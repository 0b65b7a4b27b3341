"""Two-stage recommendation over exported models: a retrieval model picks N
candidates from the whole catalogue for a user's history, the ranker scores
all N in ONE batched request, and the top ones come back by click probability.

Both stages are reached through `predict_tensors(inputs, signature)`:
`ServingClient` (TF Serving or the stand-in over gRPC) or `LocalModel` (a
SavedModel loaded in this process). Library:

    recommender = Recommender(ServingClient(target, "retrieval"), ServingClient(target, "dare"))
    result = recommender.recommend(hist_items, hist_categories, n=200, top=10, explain=True)

Command line: `python -m serving.client recommend` (serving/client.py).
"""

from __future__ import annotations

import time

import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.fields import HISTORY_ONLY, FieldSchema
from dare_tf.data.storage.schema import (HIST_CATEGORIES, HIST_ITEMS, HIST_TIME_GAP, candidate_feature,
    history_feature)
from dare_tf.ids import as_ids
from dare_tf.serving.encoding import (TooManyCandidates, candidate_tensors, history_tensors,
                                      rank_results, rank_tensors)
from dare_tf.serving.client import LocalModel, dataset_of, refusals  # noqa: F401 (where programs have found them)
from dare_tf.signatures import ITEM_FIELDS, RANK, RANK_EXPLAIN, VOCABULARY


@public("dare_tf.serving")
class Recommender:
    """Retrieval, then ranking, for one user at a time.

    Args:
        retrieval: the retrieval export (`dare_tf.export.retrieval`), as a
            `ServingClient` or `LocalModel`.
        ranker: a ranker export (`dare_tf.export`), the same way; its `rank`
            signature scores all N candidates against the user's one history
            (sent once, merged with other users' requests by TF Serving's
            batcher).
        histories: a history service (`dare_tf.histories`) for
            `recommend_user`.

    The first call checks, through both exports' `dataset` signature, that
    they map raw ids through the same id maps, and refuses otherwise; it also
    learns the ranker's further fields (`fields`): a history then carries
    their values (`recommend`'s `fields`, or the history service's), the
    candidates' come from the ranker's `item_fields` signature, and the time
    gap is each click's age at `now`.
    """

    def __init__(self, retrieval, ranker, histories=None):
        self.retrieval, self.ranker, self.histories = retrieval, ranker, histories
        self.checked, self.fields, self.strings, self.max_len, self.notes = False, [], False, None, []
        self.schema = FieldSchema()  # (the ranker's fields, by name: `check_same_dataset`)

    def check_same_dataset(self) -> None:
        mine = dataset_of(self.retrieval, "retrieval")["id_maps"]
        ranker = dataset_of(self.ranker, "ranking")
        theirs, self.fields, self.strings = ranker["id_maps"], ranker["fields"], ranker["strings"]
        self.max_len, self.notes = ranker["max_len"], ranker["notes"]
        self.schema = self.field_schema(self.fields)
        if mine != theirs:
            raise ValueError(
                f"the retrieval model {self.retrieval.model_name!r} and the ranker {self.ranker.model_name!r} "
                f"were exported from different datasets (id maps {mine} and {theirs}): their raw ids do not "
                "mean the same items; export both from one prepared dataset")
        self.checked = True

    def recommend(self, hist_items, hist_categories, n: int = 200, top: int = 10, explain: bool = False,
                  fields: dict | None = None) -> dict:
        """One user's history (raw ids, oldest first; ids <= 0 are padding, unknown
        ids go to the out-of-vocabulary rows) -> the `top` of the retrieval
        model's first `n` candidates by the ranker's click probability:
        `items`, `categories`, `probability`, `retrieval_rank` (1 = the
        retrieval model's first), `retrieval_score` and `source` (what placed
        the candidate: `dare_tf.signatures.CANDIDATE_ORIGINS`; absent from an
        export older than it); with `explain`, also the ranker's
        `history_index` `[top, K]` (index into `hist_items`, -1 for none) and
        `attention_weight` `[top, K]`. An empty or all-padding history is
        valid (both models see only padding). `fields`: the history's values of
        the ranker's further fields, `hist_<name>` (the time gap's: each click's
        age), exactly those the ranker reads."""
        return self._recommend(hist_items, hist_categories, n, top, explain, fields)

    def _recommend(self, hist_items, hist_categories, n, top, explain, fields, history=None) -> dict:
        """`recommend`; with `history` (a `Histories`, `fields` beside it), `rank` reads its layout."""
        if n < 1 or top < 1:
            raise ValueError(f"n={n}, top={top}: both must be >= 1")
        items, categories = history_ids(hist_items, hist_categories)
        retrieved = self.retrieve(items, categories, n)
        ranked = self.rank(items, categories, retrieved, fields, explain, history)
        order = np.argsort(-ranked["probability"], kind="stable")[:top]
        result = {"items": retrieved["items"][order], "categories": retrieved["categories"][order],
                  "probability": ranked["probability"][order], "retrieval_rank": order + 1,
                  "retrieval_score": retrieved["scores"][order]}
        if "sources" in retrieved:
            result["source"] = retrieved["sources"][order]
        result["candidates"] = candidate_counts(retrieved, categories)
        unknown = self.unknown_clicks(items, categories)
        if unknown is not None:
            result["unknown"] = unknown
        if explain:
            result["history_index"] = ranked["history_index"][order]
            result["attention_weight"] = ranked["attention_weight"][order]
        return result

    def unknown_clicks(self, hist_items, hist_categories) -> dict | None:
        """What of a history (as `history_ids` returns it) the ranker's id maps do not
        hold, by its `vocabulary` signature: `clicks` (the history's), `items` and
        `categories`, the clicks of an unknown item and of an unknown category, and
        `newest_item`, `newest_category`, the newest click's ids where the models do
        not know them (None where they do). None for an export without that signature
        (older than it)."""
        real = np.flatnonzero(hist_items != "" if hist_items.dtype == object else hist_items > 0)
        if not len(real):
            return {"clicks": 0, "items": 0, "categories": 0, "newest_item": None, "newest_category": None}
        try:
            known = self.ranker.predict_tensors({"item_ids": hist_items[real], "category_ids": hist_categories[real]},
                                                VOCABULARY)
        except refusals():
            return None
        item_known, category_known = (np.asarray(known[k], bool) for k in ("item_known", "category_known"))
        newest = real[-1]

        def plain(value):  # (a raw id as JSON writes it)
            return value.decode() if isinstance(value, bytes) else value if isinstance(value, str) else int(value)
        return {"clicks": len(real), "items": int((~item_known).sum()), "categories": int((~category_known).sum()),
                "newest_item": None if item_known[-1] else plain(hist_items[newest]),
                "newest_category": None if category_known[-1] else plain(hist_categories[newest])}

    def retrieve(self, hist_items, hist_categories, n: int | None = None) -> dict:
        """The retrieval model's first `n` candidates (None: all it returns) for one
        history (as `history_ids` returns it): `items`, `categories`, `scores`
        `[n]` and, from an export that reports them, `sources` (decoded names)."""
        if not self.checked:
            self.check_same_dataset()
        # (one padding slot for an empty history: the retrieval signature takes [1, T] with T >= 1)
        padding = np.array([""], object) if self.strings else np.zeros([1], np.int64)
        sent = (hist_items, hist_categories) if len(hist_items) else (padding, padding)
        retrieved = self.retrieval.predict_tensors({HIST_ITEMS: sent[0][None], HIST_CATEGORIES: sent[1][None]})
        available = retrieved["items"].shape[1]
        n = available if n is None else n
        if n > available:
            raise TooManyCandidates(f"n={n}: the retrieval model {self.retrieval.model_name!r} returns {available} "
                             "candidates (its export's --top_n, at most the catalogue); ask for at most that")
        out = {k: _decoded(retrieved[k][0, :n]) for k in ("items", "categories", "scores")}
        if "sources" in retrieved:
            out["sources"] = np.array([s.decode() for s in retrieved["sources"][0, :n]])
        return out

    def rank(self, hist_items, hist_categories, retrieved: dict, fields: dict | None = None,
             explain: bool = False, history=None) -> dict:
        """The ranker's answer for all of `retrieved`'s candidates (`retrieve`'s
        output) in one `rank` (or `rank_explain`) request: `probability` `[n]`
        in the candidates' order; with `explain`, `history_index` and
        `attention_weight` `[n, K]`. `fields` as for `recommend`; with `history`
        (a `Histories` of this one user, as the history service returned it, and
        `fields` `[1, T]` beside it) its layout is `rank`'s as it is."""
        if not self.checked:
            self.check_same_dataset()
        candidates = retrieved["items"]
        self._check_fields(fields or {})
        candidate_fields = self._candidate_fields(candidates)
        if history is not None:
            inputs = {**history_tensors(history.items[:1], history.categories[:1], history.lengths[:1], fields),
                      **candidate_tensors([candidates], [retrieved["categories"]], candidate_fields)}
            return rank_results(inputs, self.ranker.predict_tensors(inputs, RANK_EXPLAIN if explain else RANK))[0]
        if self.strings and not len(hist_items):  # (an empty history of string ids)
            hist_items = hist_categories = np.zeros(0, object)
        given = {k: [as_ids(k, v).reshape(-1)] for k, v in (fields or {}).items()}
        inputs = rank_tensors([hist_items], [hist_categories], [candidates], [retrieved["categories"]],
                              {**given, **candidate_fields})
        return rank_results(inputs, self.ranker.predict_tensors(inputs, RANK_EXPLAIN if explain else RANK))[0]

    def _check_fields(self, given: dict) -> None:
        """The history's field inputs (`given`) against the ranker's fields, in one line."""
        wanted = set(self.schema.inputs("hist"))
        if set(given) != wanted:
            missing, extra = sorted(wanted - set(given)), sorted(set(given) - wanted)
            raise ValueError(f"the ranker {self.ranker.model_name!r} reads the fields {self.fields or 'none'}: "
                             + "; ".join([f"give {', '.join(missing)}"] * bool(missing)
                                         + [f"it has no {', '.join(extra)}"] * bool(extra)))

    @staticmethod
    def field_schema(names) -> FieldSchema:
        """The ranker's fields by name (its `dataset` signature's), those without an
        item value (the time gap, the action) history only."""
        return FieldSchema(tuple({"name": name, "history_only": name in HISTORY_ONLY} for name in names))

    def _candidate_fields(self, candidates) -> dict:
        """The candidates' field inputs (`candidate_<name>`, one list), from the ranker's `item_fields`."""
        if not self.schema.inputs("candidate"):  # (no field with an item's value: none, or the action alone)
            return {}
        values = self.ranker.predict_tensors({"item_ids": np.asarray(candidates, object if self.strings
                                                                     else np.int64)}, ITEM_FIELDS)
        return {candidate_feature(name): [_decoded(values[name])] for name in self.fields if name in values}

    def recommend_user(self, user_id, n: int = 200, top: int = 10, explain: bool = False, max_len: int | None = None,
                       now: int | None = None):
        """`recommend` for a user whose history the history service holds (`histories`):
        the user's last `max_len` clicks (default: the ranker's own history length, as
        its export says; all the store keeps for an export older than that) are read at
        call time, so a click appended a moment ago counts; the ranker's further
        fields come from the store, the time gap is each click's age at `now`
        (default: the current Unix time). Returns `(result, history)`:
        `recommend`'s result and the `Histories` it read."""
        if self.histories is None:
            raise ValueError("recommend_user needs a history service (Recommender(..., histories=open_store(...)))")
        if not self.checked:
            self.check_same_dataset()
        history = self.histories.last([user_id], self.max_len if max_len is None else max_len)
        fields = self.history_fields(history, now)
        items, categories = history.row(0)
        return self._recommend(items, categories, n, top, explain, fields, history), history

    def history_inputs(self, history, now: int | None = None) -> tuple:
        """`(hist_items, hist_categories, fields)` of the first user of `history`
        (a `Histories` the history service returned) for this ranker: its
        further fields from the store, the time gap as each click's age at
        `now` (default: the current Unix time)."""
        items, categories = history.row(0)
        n = history.lengths[0]
        return items, categories, {name: values[0, :n] for name, values in self.history_fields(history, now).items()}

    def history_fields(self, history, now: int | None = None) -> dict:
        """The ranker's field inputs of the first user of `history`, `[1, T]` as the
        history service laid them out: the store's fields, and the time gap as each
        click's age at `now` (default: the current Unix time); refuses a store
        without the ranker's fields in one line."""
        if not self.checked:
            self.check_same_dataset()
        missing = [name for name in self.schema.columns if name not in history.fields]
        if missing:
            raise ValueError(f"the ranker {self.ranker.model_name!r} reads the fields {self.fields}, but the history "
                             f"store {getattr(self.histories, 'url', '')} keeps {list(history.fields) or 'none'}: it "
                             f"lacks {', '.join(missing)}")
        fields = {history_feature(name): history.fields[name][:1] for name in self.schema.columns}
        if self.schema.time_gap:
            now = int(time.time()) if now is None else int(now)
            fields[HIST_TIME_GAP] = now - history.times[:1]
        return fields


def candidate_counts(retrieved: dict, hist_categories) -> dict:
    """What the retrieval model's candidates hold: `n`, the count each source placed
    (where the export reports sources), and `newest_category`, the category of the
    history's newest click with `in_newest_category`, the candidates of it (a click
    of a new category brings such candidates through `recent_categories`, where the
    retrieval run's quotas give it a share)."""
    out = {"n": len(retrieved["items"])}
    if "sources" in retrieved:
        names, counts = np.unique(retrieved["sources"], return_counts=True)
        out["sources"] = {str(k): int(v) for k, v in zip(names, counts)}
    if len(hist_categories):
        newest = hist_categories[-1]
        out["newest_category"] = newest.item() if hasattr(newest, "item") else newest
        out["in_newest_category"] = int(np.sum(retrieved["categories"] == newest))
    return out


def _decoded(values: np.ndarray) -> np.ndarray:
    """An answer's string ids (bytes, from an export of string ids) as `str`; other values as they are."""
    if values.dtype == object:
        return np.array([v.decode() if isinstance(v, bytes) else v for v in values.reshape(-1)],
                        object).reshape(values.shape)
    return values


def history_ids(hist_items, hist_categories) -> tuple[np.ndarray, np.ndarray]:
    """One user's history as two flat int64 arrays of equal length (one line
    otherwise)."""
    items = as_ids(HIST_ITEMS, hist_items).reshape(-1)
    categories = as_ids(HIST_CATEGORIES, hist_categories).reshape(-1)
    if items.shape != categories.shape:
        raise ValueError(f"hist_items has {len(items)} ids but hist_categories {len(categories)}")
    return items, categories
