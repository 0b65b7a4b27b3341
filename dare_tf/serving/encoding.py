"""Serving requests and answers as numpy arrays, whatever carries them: the
signatures' input tensors of a batch of users (`request_tensors`, `rank_tensors`:
histories of any length, the leading width column of `dare_tf.signatures`), and
their answers read back (`rank_results`, `row_errors`, `in_own_history`,
`explained_behaviours`) and printed (`history_line`, `format_recommendations`).
Pure numpy: the transports (`dare_tf.serving.client` over gRPC,
`dare_tf.serving.rest` over HTTP) only carry these tensors.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dare_tf._faces import public
from dare_tf.data.storage.schema import (CANDIDATE_CATEGORIES, CANDIDATE_ITEMS, HIST_CATEGORIES, HIST_ITEMS,
    TARGET_CATEGORY, TARGET_ITEM, input_role)
from dare_tf.ids import as_ids
from dare_tf.signatures import (CANDIDATE_COUNT, CANDIDATE_SOURCES, HIST_LENGTH, RANK, ROW_ERROR,
                                with_width_column)


class TooManyCandidates(ValueError):
    """A request for more candidates than the retrieval model returns: the caller's
    mistake (the inspect page's 400), not the server's."""


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


@public("dare_tf.serving")
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
    for name, rows in (fields or {}).items():
        if input_role(name) == "target" or len(rows) != len(hist_items):
            raise ValueError(f"rank: fields[{name!r}]: expected hist_<field> or candidate_<field> with one row per "
                             f"user ({len(hist_items)})")
    roles = {role: {k: v for k, v in (fields or {}).items() if input_role(k) == role} for role in ("hist", "candidate")}
    return {**_rows_of((HIST_ITEMS, HIST_CATEGORIES, HIST_LENGTH), hist_items, hist_categories, roles["hist"]),
            **candidate_tensors(candidate_items, candidate_categories, roles["candidate"])}


def candidate_tensors(candidate_items, candidate_categories, fields: dict | None = None) -> dict[str, np.ndarray]:
    """`rank`'s candidate inputs for U users: per user a candidate list (raw ids) of
    any length; `fields`: `candidate_<field>`, one value per candidate."""
    return _rows_of((CANDIDATE_ITEMS, CANDIDATE_CATEGORIES, CANDIDATE_COUNT), candidate_items, candidate_categories,
                    fields or {})


def _rows_of(names: tuple[str, str, str], id_rows, category_rows, fields: dict) -> dict[str, np.ndarray]:
    """One side of `rank` (names: its ids, categories and length inputs) from per-user lists."""
    ids, categories, length = names
    out = {}
    out[ids], lengths = left_aligned(id_rows, ids)
    out[categories], other = left_aligned(category_rows, categories)
    if (lengths != other).any():
        user = int(np.flatnonzero(lengths != other)[0])
        raise ValueError(f"rank: user {user} has {lengths[user]} {ids} but {other[user]} {categories}")
    out[length] = lengths
    for name, rows in fields.items():
        out[name], given = left_aligned(rows, name)
        if (given != lengths).any():
            user = int(np.flatnonzero(given != lengths)[0])
            raise ValueError(f"rank: user {user} has {lengths[user]} {ids} but {given[user]} {name}")
    return out


@public("dare_tf.serving")
def history_tensors(items, categories, lengths, fields: dict | None = None) -> dict[str, np.ndarray]:
    """`rank`'s history inputs for U users whose histories are laid out as it takes
    them, as the history service's `Histories` holds them: `[U, T]` ids, each
    row's first `lengths[u]` its history (oldest first), padding after;
    `fields`: `hist_<field>` `[U, T]` the same way. Only the leading width column
    is added (`rank_tensors` lays out histories given as lists)."""
    items, categories = as_ids(HIST_ITEMS, items), as_ids(HIST_CATEGORIES, categories)
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    if items.ndim != 2 or categories.shape != items.shape or lengths.shape != items.shape[:1] \
            or ((lengths < 0) | (lengths > items.shape[1])).any():
        raise ValueError(f"rank: hist_items {items.shape}, hist_categories {categories.shape} and {len(lengths)} "
                         "lengths are not [U, T] rows with each row's length (0..T)")
    out = {HIST_ITEMS: with_width_column(items), HIST_CATEGORIES: with_width_column(categories), HIST_LENGTH: lengths}
    for name, values in (fields or {}).items():
        values = as_ids(name, values)
        if input_role(name) != "hist" or values.shape != items.shape:
            raise ValueError(f"rank: fields[{name!r}]: expected a hist_<field> {items.shape} beside hist_items, "
                             f"got {values.shape}")
        out[name] = with_width_column(values)
    return out


@public("dare_tf.serving")
def rank_results(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A `rank` (or `rank_explain`) answer per user, cut to that user's candidates
    (TF Serving returns a merged batch's padded width); raises ValueError for a
    row the server refused (`row_errors`)."""
    outputs = row_errors(RANK, outputs)
    return [{name: value[user, :inputs[CANDIDATE_COUNT][user]] for name, value in outputs.items()}
            for user in range(len(inputs[CANDIDATE_COUNT]))]


@public("dare_tf.serving")
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
        if input_role(name) == "target":
            out[name] = as_ids(name, values).reshape(-1)
        elif input_role(name) == "hist":
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


def history_line(user_id, history, url: str) -> str:
    """`recommend --user_id`'s first line: what it read of the user, the history's
    size and its newest click (item, category, time; a click loaded from a dataset
    prepared without times has none: `time unknown`), so that a live click shows."""
    from dare_tf.data.logs.times import utc_time

    n = int(history.lengths[0])
    if not n:
        return f"user {user_id}: no clicks in {url} (an unknown user, or none yet): ranked for an empty history"
    at = int(history.times[0, n - 1]) if history.times is not None else 0
    return (f"user {user_id}: {n} clicks in {url}; the newest: item {history.items[0, n - 1]}, category "
            f"{history.categories[0, n - 1]}, {utc_time(at) if at > 0 else 'time unknown'}")


def candidates_line(counts: dict) -> str:
    """`recommend`'s second line: what the candidates hold (`candidate_counts`), so
    that a live click shows in them even where the ranker's top does not move."""
    sources = counts.get("sources")
    line = f"the {counts['n']} candidates"
    if sources is not None:
        named = [*CANDIDATE_SOURCES, *sorted(set(sources) - set(CANDIDATE_SOURCES))]
        line += ": " + ", ".join(f"{sources.get(name, 0)} {name}" for name in named)
    if "newest_category" in counts:
        line += (f"{';' if sources is not None else ':'} {counts['in_newest_category']} of the newest click's "
                 f"category {counts['newest_category']}")
    return line


# What to do about clicks of items or categories the models do not know (docs/daily.md).
NEW_SINCE_THE_DATASET = ("not in the models' vocabulary (new since the dataset): data.prepare --append, then train "
                         "with --init_from")


def vocabulary_line(unknown: dict | None) -> str | None:
    """`recommend`'s line on the history's clicks the models do not know
    (`Recommender.unknown_clicks`), naming the newest click's item or category first;
    None where the models know every click (or cannot say)."""
    if not unknown or not (unknown["items"] or unknown["categories"]):
        return None
    newest = [f"{kind} {unknown[f'newest_{kind}']}" for kind in ("category", "item")
              if unknown[f"newest_{kind}"] is not None]
    named = f"the newest click's {' and '.join(newest)}: " if newest else ""
    clicks = unknown["clicks"]
    return (f"{named}{NEW_SINCE_THE_DATASET} (of the history's {clicks} click{'s' * (clicks != 1)}, "
            f"{unknown['items']} of an unknown item, {unknown['categories']} of an unknown category)")


def notes_line(model_name: str, notes) -> str | None:
    """`recommend`'s line on the ranker's run's warnings (`dataset_of`'s `notes`: an
    undertrained model), None for a run without any."""
    if not notes:
        return None
    return f"the ranker {model_name!r} was flagged when it was trained: {'; '.join(notes)}"


@public("dare_tf.serving")
def format_recommendations(result: dict, hist_items, hist_categories, behaviours: int = 3) -> str:
    """A markdown table of `Recommender.recommend`'s result (with the source that
    placed each candidate, where the retrieval export reports it); with an
    explanation, each row names the ranker's `behaviours` heaviest retrieved
    behaviours."""
    hist_items, hist_categories = np.asarray(hist_items).reshape(-1), np.asarray(hist_categories).reshape(-1)
    explained, sourced = "history_index" in result, "source" in result
    lines = ["| rank | item | category | P(click) | retrieval rank |" + " source |" * sourced
             + " heaviest behaviours (item/category (clicks ago): weight) |" * explained,
             "|---|---|---|---|---|" + "---|" * (sourced + explained)]
    for row in range(len(result["items"])):
        line = (f"| {row + 1} | {result['items'][row]} | {result['categories'][row]} | "
                f"{result['probability'][row]:.4f} | {result['retrieval_rank'][row]} |")
        if sourced:
            line += f" {result['source'][row]} |"
        if explained:
            heaviest = explained_behaviours(result["history_index"][row], result["attention_weight"][row],
                                            hist_items, hist_categories)[:behaviours]
            line += " " + ", ".join(f"{b['item']}/{b['category']} ({b['clicks_ago']} ago): {b['weight']:.3f}"
                                    for b in heaviest) + " |"
        lines.append(line)
    return "\n".join(lines)
