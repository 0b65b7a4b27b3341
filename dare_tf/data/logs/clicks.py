"""A log's rows once read (`Clicks`: raw ids in file order) and what reorders or
renumbers them: dense ids in order of first appearance, a field's empty cells,
the protocol's user order and a time split's time order."""

from __future__ import annotations

import dataclasses

import numpy as np

from dare_tf.data.logs.formats import ACTION_FIELD


@dataclasses.dataclass
class Clicks:
    """Rows of a log in file order (raw ids): clicks, or with `label`, impressions,
    or with `click_code` (`--action_field`) every action, its code in `fields`."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    time: np.ndarray
    rows: int  # data rows read (header excluded, bad lines included)
    bad_lines: int
    sha256: str
    label: np.ndarray | None = None
    fields: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # name -> raw ids (`LogFormat.columns`)
    click_code: int | None = None
    # `--string_ids`: the ids above are codes; the strings of each role's (`user`, `item`, `category`, a field's
    # name) codes (`dare_tf.data.logs.string_ids`).
    names: dict[str, np.ndarray] | None = None
    # `skip_bad_lines`: the problems of the skipped lines, `{kind: [lines, the first one's "where: problem"]}`
    # (`dare_tf.data.logs.blocks.bad_kind`; `dare_tf.data.logs.reader.check_bad_share` reads them).
    bad_reasons: dict[str, list] = dataclasses.field(default_factory=dict)

    def raw(self, role: str, codes) -> np.ndarray:
        """A role's raw ids as the id maps write them: the codes' strings with
        `--string_ids` (a field's own values as `own_value`s), else the ids."""
        if self.names is None or role not in self.names:
            return np.asarray(codes)
        from dare_tf.data.logs.string_ids import as_strings

        return as_strings(codes, self.names[role], self.names["item"])

    def clicked(self) -> np.ndarray:
        """Which rows are clicks: every row of a click log, an impression log's
        labelled 1, and with `--action_field` the rows whose action is a click."""
        if self.click_code is not None:
            return self.fields[ACTION_FIELD] == self.click_code
        return np.ones(len(self.user), bool) if self.label is None else self.label == 1


def dense_ids(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense 1-based ids in order of first appearance, and the raw id of each dense id."""
    uniq, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(1, len(uniq) + 1)
    return rank[inverse].reshape(-1), uniq[order]


def own_values(values: np.ndarray, items: np.ndarray) -> np.ndarray:
    """A field's values with its empty cells (-1) as the item's own value, `-1 - item`."""
    values = np.asarray(values, np.int64)
    return np.where(values < 0, -1 - np.asarray(items, np.int64), values)


def time_sorted(clicks: Clicks) -> Clicks:
    """The order of a log whose rows are not in time order (Tmall, custom logs):
    users in order of first row, each user's rows stably sorted by time."""
    user_rank, _ = dense_ids(clicks.user)
    return _reordered(clicks, np.lexsort((clicks.time, user_rank)))  # lexsort is stable


def in_time_order(clicks: Clicks) -> Clicks:
    """The rows in time order, ties in file order (a `--split=time` log)."""
    return _reordered(clicks, np.lexsort((np.arange(len(clicks.time)), clicks.time)))


def _reordered(clicks: Clicks, order: np.ndarray) -> Clicks:
    return dataclasses.replace(clicks, user=clicks.user[order], item=clicks.item[order],
                               category=clicks.category[order], time=clicks.time[order],
                               label=None if clicks.label is None else clicks.label[order],
                               fields={k: v[order] for k, v in clicks.fields.items()})
