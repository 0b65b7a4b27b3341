"""The paper's sample construction (as its code, github.com/thuml/DARE, builds it), vectorised,
written as a per-user sequence store and compact examples in TFRecord files.

From the rows of a click log: dense 1-based ids in order of first
appearance, per-user click sequences, the >= min_clicks user filter, train
targets x_{T-2-stride*j} (j < train_targets), validation target x_{T-1}, test
target x_T, and `negatives` negatives per positive drawn by click frequency
and rejected if the user clicked them anywhere in the log. From an impression
log (a 0/1 label per row): each user's impressions in time order are the
examples with their own labels (the last one is the test example, the one
before it the validation example, the earlier ones train), no negatives are
drawn, and each history is the user's clicks strictly before the
impression's time.

What is written (`dare_tf.data.storage.records` reads it), users assigned to
`partitions` partitions by a hash of their id (`dare_tf.data.storage.shards.partition_of`):

- the store: per qualifying user, one record of its time-ordered item and
  category ids (`store-0000k-of-0000P.tfrecord.gz` holds partition k);
- the examples of each split: one record (user, cut-off position, target
  item, target category, label) per example (`SPLIT-0000k-of-0000P...`
  holds partition k's users' examples); the history of an example is the
  most recent L clicks of its user before the cut-off, assembled when read,
  so L is chosen at training time.

The protocol is split into what needs the whole log (`LogStatistics`: dense
ids, item categories and frequencies, sequence lengths) and what needs one
chunk of `USERS_PER_CHUNK` users only (`chunk_examples`, with its own
negative-sampling stream). The in-memory driver (`dare_tf.data.preparation.in_memory`)
and the Apache Beam driver (`dare_tf.data.preparation.beam`) share all of it and write
the same records. The dataset directory appears complete or not at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from dare_tf._faces import public
from dare_tf.data.preparation.examples import (MIN_IMPRESSIONS)
from dare_tf.data.logs.formats import LogFormat
from dare_tf.data.preparation.prepared import (MAX_PARTITIONS)
from dare_tf.data.storage.spec import FORMAT, MAX_LEN
from dare_tf.data.logs.times import DAY

MAX_NEGATIVES = 100
SPLIT_KINDS = ("user", "time")
TIME_SPLIT_FIELDS = ("split", "val_days", "test_days", "val_from", "test_from")


@public("dare_tf.data")
@dataclasses.dataclass(frozen=True)
class Protocol:
    """The sample-construction parameters (the paper's code, github.com/thuml/DARE).

    Attributes:
        seed: seed of the negative sampling.
        min_clicks: users with fewer clicks are dropped.
        max_len: the dataset's default history length L (`spec.json`); a
            trainer may choose any other (`--max_len`): histories are
            assembled from the store when read.
        train_targets: train targets per user: x_{T-2-stride*j}, j < train_targets
            (click logs; an impression log's train examples are all of a
            user's impressions before its last two).
        stride: clicks between consecutive train targets (click logs).
        negatives: negatives per positive (click logs).
        partitions: shards of the store and of each split; users are
            assigned to them by a hash of their id, and `multi_worker`
            training gives each worker whole partitions (at least one each).
        split: `user`, the paper's per-user protocol (`train_targets`, `stride`; the last click
            of each user is its test target, the one before it validation);
            or `time`: the log read as days, every row an example of the
            window its time falls in (train before the validation window,
            then validation, then test), its history the user's clicks
            strictly before that time (each user's rows in time order), so
            no example sees its future. Dense ids follow the first appearance
            in time (ties in file order), so the id maps of a log's first days
            are the beginning of the whole log's. Click logs: every click with an
            earlier click is a target, with `negatives` negatives drawn by that
            day's clicks, none clicked by the user up to that day; impression
            logs: every impression. A user's examples start on the day its
            clicks reach `min_clicks`. Every day is built from itself and the
            days before it only, so a day can be appended to the dataset
            (`data.prepare --append`, `dare_tf.data.preparation.days`). `train_targets`
            and `stride` are not used.
        val_days, test_days: `time`: the last `test_days` days of the log
            (UTC days of the time column, read as seconds) are the test
            window, the `val_days` days before them validation.
        val_from, test_from: `time`: the windows' first times instead (in the
            time column's unit; both or neither).
        time_gap: add the derived time-gap field (`dare_tf.data.storage.fields`): the
            store keeps every click's time, the examples their target's.
    """

    seed: int = 0
    min_clicks: int = 210
    max_len: int = 200
    train_targets: int = 19
    stride: int = 5
    negatives: int = 2
    partitions: int = 16
    split: str = "user"
    val_days: int = 1
    test_days: int = 1
    val_from: int | None = None
    test_from: int | None = None
    time_gap: bool = False

    def __post_init__(self):
        self.validate(impressions=True)  # the checks of every log; prepare adds those of a click log

    def validate(self, impressions: bool = False) -> None:
        earliest = least_clicks(self.train_targets, self.stride) - 2
        checks = [
            (0 <= self.seed < 2**32, "seed", "must be in [0, 2^32)"),
            (1 <= self.max_len <= MAX_LEN, "max_len", f"must be in [1, {MAX_LEN}]"),
            (0 <= self.train_targets <= 10_000, "train_targets", "must be in [0, 10000]"),
            (1 <= self.stride <= 10_000, "stride", "must be in [1, 10000]"),
            (0 <= self.negatives <= MAX_NEGATIVES, "negatives", f"must be in [0, {MAX_NEGATIVES}]"),
            (1 <= self.partitions <= MAX_PARTITIONS, "partitions", f"must be in [1, {MAX_PARTITIONS}]"),
            (self.min_clicks >= 0, "min_clicks", "must be >= 0"),
            (self.split in SPLIT_KINDS, "split", f"must be one of {SPLIT_KINDS}"),
            (self.val_days >= 1 and self.test_days >= 1, "val_days" if self.val_days < 1 else "test_days",
             "must be >= 1"),
            ((self.val_from is None) == (self.test_from is None), "val_from" if self.val_from is None else "test_from",
             "--val_from and --test_from go together (or neither: --val_days, --test_days)"),
            (self.val_from is None or self.test_from is None or self.val_from < self.test_from, "val_from",
             f"must be before --test_from={self.test_from}"),
            (self.split == "time" or (self.val_from is None and (self.val_days, self.test_days) == (1, 1)), "split",
             "--val_days, --test_days, --val_from and --test_from are for --split=time"),
            (impressions or self.split == "time" or self.min_clicks >= earliest + 2, "min_clicks",
             f"must be >= {earliest + 2} so that the earliest train target has a history (train_targets="
             f"{self.train_targets} targets, one every stride={self.stride} clicks, reach {earliest} clicks back); "
             "raise --min_clicks, or lower --train_targets or --stride"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)}: {message}")

    def bounds(self, last_time: int) -> tuple[int, int]:
        """`--split=time`: the first times of the validation and the test windows, for
        a log whose latest row is at `last_time` (explicit, or whole UTC days)."""
        if self.val_from is not None:
            return int(self.val_from), int(self.test_from)
        test_from = (int(last_time) // DAY - self.test_days + 1) * DAY
        return test_from - self.val_days * DAY, test_from

    def to_json(self) -> dict:
        """The protocol as spec.json records it; the time split's fields only with
        `--split=time` (so that a per-user dataset is recorded, and identified, as
        it was before they existed)."""
        fields = dataclasses.asdict(self)
        if self.split == "user":
            for name in TIME_SPLIT_FIELDS:
                del fields[name]
        if not self.time_gap:  # (recorded only when set: earlier datasets keep their identity)
            del fields["time_gap"]
        return fields

    def target_offsets(self) -> dict[str, np.ndarray]:
        """Per split, each target's offset from the end of its user's sequence:
        train T-2-stride*j (1-based), val T-1, test T."""
        return {"train": 3 + self.stride * np.arange(self.train_targets),
                "val": np.array([2]), "test": np.array([1])}


def preparation_id(source_sha256: str, protocol: Protocol, fmt: LogFormat, compression: str) -> str:
    """The id of a preparation: the same for the same log, log format, protocol
    and compression (whichever driver prepared it), different otherwise."""
    text = json.dumps([FORMAT, fmt.to_json(), source_sha256, protocol.to_json(), compression],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def no_user_qualifies(protocol: Protocol, longest: int, impressions: bool = False) -> ValueError:
    extra = f" and >= {MIN_IMPRESSIONS} impressions" if impressions else ""
    return ValueError(f"no user has >= {protocol.min_clicks} clicks{extra} (the longest history has "
                      f"{longest} clicks); lower --min_clicks or use a larger log")


def time_windows(protocol: Protocol, bounds: tuple[int, int] | None) -> dict:
    """spec.json's `windows` of a `--split=time` dataset: each split's first time
    (train: None, from the log's start); {} for the per-user split."""
    if bounds is None:
        return {}
    return {"windows": {"train": None, "val": int(bounds[0]), "test": int(bounds[1])}}


def least_clicks(train_targets: int, stride: int) -> int:
    """The fewest clicks a user of the per-user split needs for `train_targets`
    targets `stride` clicks apart: the earliest target x_{T-2-stride*(n-1)} (1-based)
    must have a click before it."""
    return max(2 + stride * (train_targets - 1), 0) + 2


def users_by_clicks(clicks_per_user) -> dict:
    """The distribution of clicks per user of a log (`{"clicks": [c, ...], "users":
    [n, ...]}`, ascending): spec.json's `source` keeps it for `choices_line`."""
    values, users = np.unique(np.asarray(clicks_per_user, np.int64), return_counts=True)
    return {"clicks": values.tolist(), "users": users.tolist()}


def choices_line(distribution: dict | None, protocol: Protocol, kept: int) -> str | None:
    """Where the protocol kept fewer than half of a log's users (`distribution`:
    `users_by_clicks`), one line: how many it kept and how many each lower
    `--train_targets` (with the least `--min_clicks` it allows) or, for
    `--split=time`, each lower `--min_clicks` would keep; None otherwise."""
    if not distribution:
        return None
    clicks, users = np.asarray(distribution["clicks"]), np.asarray(distribution["users"])
    total = int(users.sum())
    if not total or kept * 2 >= total:
        return None
    at = lambda share: int(clicks[np.searchsorted(np.cumsum(users), share * total)])  # noqa: E731
    keeps = lambda least: int(users[clicks >= least].sum())  # noqa: E731
    options = []
    if protocol.split == "time":
        for least in sorted({at(0.5), at(0.25)}, reverse=True):
            if least < protocol.min_clicks:
                options.append((f"--min_clicks={least}", keeps(least)))
    else:
        targets = protocol.train_targets
        while True:
            least = min(protocol.min_clicks, least_clicks(targets, protocol.stride))
            if keeps(least) > kept and (not options or keeps(least) > options[-1][1]):
                options.append((f"--train_targets={targets} --min_clicks={least}", keeps(least)))
            if targets <= 1:
                break
            targets //= 2
    line = (f"kept {kept:,} of the log's {total:,} users (>= --min_clicks={protocol.min_clicks} clicks; the median "
            f"user has {at(0.5):,})")
    return line + ("; more with " + ", ".join(f"{flags}: {n:,} users" for flags, n in options) if options else "")
