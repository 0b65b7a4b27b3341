"""The real logs that `data.synthetic --like=taobao|tmall` reproduces: each one's
counts (users, items, categories, each action's rows; Tmall's sellers and
brands), its click-length distribution and its days (`LIKE`), and the small
real samples a checkout may find beside it (`SAMPLES`): the same formats at the
samples' counts, with their quirks."""

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
        shuffled: each user's rows are written in a random order (Tmall's
            file: a user's rows are grouped but not in time order).
        empty_brands: rows whose `brand_id` cell is empty (Tmall's file).
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
    shuffled: bool = False
    empty_brands: int = 0

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
        empty = self.empty_brands and n(self.empty_brands)
        return dataclasses.replace(self, users=users, items=min(n(self.items), actions[0][1]),
                                   categories=min(n(self.categories), n(self.items)), actions=actions,
                                   sellers=self.sellers and min(n(self.sellers), n(self.items)),
                                   brands=self.brands and min(n(self.brands), n(self.items)),
                                   empty_brands=empty)


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

# The real samples in ../shared/data (its README), which the tests stand in for with
# generated logs (`data.synthetic --like=taobao|tmall --sample`): their counts, click
# lengths, days and quirks, so a test sees the same shape of log whether the samples
# are there or not. (Each sigma gives seed 0 the sample's users with at least 210 clicks.)
SAMPLES = {
    # taobao/UserBehavior_sample.csv: 94,225 rows, 927 users (86 with at least 210 clicks).
    "taobao": Like("taobao", users=927, items=61_168, categories=3_067,
                   actions=(("pv", 84_681), ("buy", 1_955), ("cart", 5_026), ("fav", 2_563)),
                   length_median=68, length_sigma=1.09, first_day=1_511_568_000, days=9),
    # tmall/user_log_format1_sample.csv: 99,806 rows, 709 users (120 with at least 210 clicks),
    # a user's rows out of time order, 115 empty brands.
    "tmall": Like("tmall", users=709, items=45_439, categories=885, sellers=4_114, brands=4_179,
                  actions=(("0", 87_839), ("1", 70), ("2", 6_928), ("3", 4_969)),
                  length_median=76, length_sigma=0.91, first_day=1_431_302_400, days=185, shuffled=True,
                  empty_brands=115),
}
