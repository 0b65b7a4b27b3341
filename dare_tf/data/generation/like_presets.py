"""The real logs that `data.synthetic --like=taobao|tmall` reproduces: each one's
counts (users, items, categories, each action's rows; Tmall's sellers and
brands), its click-length distribution and its days (`LIKE`)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Like:
    """A real log's counts and format.

    Attributes:
        name: the `data.prepare` preset that reads it.
        users, items, categories: distinct ids in the log.
        actions: (value, rows) per action, the click first.
        sellers, brands: Tmall's further columns (0: none).
        length_median, length_sigma: the log-normal of clicks per user.
        first_day: Unix time of the first day's midnight (UTC).
        days: days the log spans.
    """

    name: str
    users: int
    items: int
    categories: int
    actions: tuple[tuple[str, int], ...]
    length_median: float
    length_sigma: float
    first_day: int
    days: int
    sellers: int = 0
    brands: int = 0

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.actions)

    def scaled(self, fraction: float) -> "Like":
        """Every count times `fraction` (at least one of each; a click per user)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction={fraction}: must be in (0, 1]")
        n = lambda x: max(1, round(x * fraction))  # noqa: E731
        actions = tuple((a, n(c)) for a, c in self.actions)
        users = min(n(self.users), actions[0][1])
        return dataclasses.replace(self, users=users, items=min(n(self.items), actions[0][1]),
                                   categories=min(n(self.categories), n(self.items)), actions=actions,
                                   sellers=self.sellers and min(n(self.sellers), n(self.items)),
                                   brands=self.brands and min(n(self.brands), n(self.items)))


LIKE = {
    # UserBehavior.csv (Tianchi 649): 2017-11-25 to 2017-12-03.
    "taobao": Like("taobao", users=987_994, items=4_162_024, categories=9_439,
                   actions=(("pv", 89_716_264), ("buy", 2_015_839), ("cart", 5_530_446), ("fav", 2_888_258)),
                   length_median=60, length_sigma=1.0, first_day=1_511_568_000, days=9),
    # user_log_format1.csv (Tianchi 42): 2015-05-11 to 2015-11-11; 0 click, 1 cart, 2 purchase, 3 favourite.
    "tmall": Like("tmall", users=424_170, items=1_090_390, categories=1_658, sellers=4_995, brands=8_444,
                  actions=(("0", 48_550_713), ("1", 76_750), ("2", 3_292_144), ("3", 3_005_723)),
                  length_median=60, length_sigma=1.1, first_day=1_431_302_400, days=185),
}
