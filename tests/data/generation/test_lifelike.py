"""dare_tf.data.generation.lifelike (`data.synthetic --like`): logs like Taobao's and Tmall's with
their exact counts (scaled), in the real files' formats as the presets read them,
with the planted structure, deterministic by seed; one-line refusals."""

import collections
import hashlib
import json

import numpy as np
import pytest

from dare_tf.data.generation.lifelike import LIKE, click_lengths, write_like
from dare_tf.data.logs.reader import read_clicks
from dare_tf.data.logs.formats import FORMATS, LogFormat
from tests.programs import run_program

FRACTION = 0.002


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("like")
    return {name: (str(root / f"{name}.csv"), write_like(name, str(root / f"{name}.csv"), FRACTION, seed=3))
            for name in LIKE}


def _rows(path: str, fmt: LogFormat) -> list[list[str]]:
    with open(path) as f:
        lines = f.read().splitlines()
    return [line.split(",") for line in lines[1 if fmt.header else 0:]]


@pytest.mark.parametrize("name", sorted(LIKE))
def test_every_count_is_the_real_logs_scaled_and_the_preset_reads_it(logs, name):
    path, truth = logs[name]
    like, fmt = LIKE[name].scaled(FRACTION), FORMATS[name]
    rows = _rows(path, fmt)
    columns = dict(fmt.columns)
    index = {c: i for i, c in enumerate(fmt.expected_header.split(","))} if fmt.header else {
        c: int(c) for c in columns.values()}
    distinct = lambda role: len({r[index[columns[role]]] for r in rows})  # noqa: E731
    assert len(rows) == like.rows == truth["counts"]["rows"]
    assert (distinct("user"), distinct("item"), distinct("category")) == (like.users, like.items, like.categories)
    actions = collections.Counter(r[index[columns["action"]]] for r in rows)
    assert actions == dict(like.actions) == truth["counts"]["actions"]
    if name == "tmall":
        assert tuple(len({r[index[c]] for r in rows}) for c in ("seller_id", "brand_id")) == (like.sellers,
                                                                                              like.brands)
        assert all(len(r[index["time_stamp"]]) == 4 for r in rows)  # MMDD, as the real file writes it
        assert {r[index["time_stamp"]] for r in rows} <= {f"{m:02d}{d:02d}" for m in range(5, 12)
                                                         for d in range(1, 32)}
    clicks = read_clicks(path, fmt)  # the preset's own reader (its header check too)
    assert len(clicks.user) == like.actions[0][1] and clicks.rows == like.rows
    days = (clicks.time.max() - clicks.time.min()) // 86_400 if name == "taobao" else None
    assert days is None or days <= like.days - 1


def test_the_planted_structure_is_there(logs):
    """Sessions stay in their category, and the generator's own AUC is as
    data.synthetic's planted logs have it."""
    path, truth = logs["taobao"]
    clicks = read_clicks(path, FORMATS["taobao"])
    same_user = clicks.user[1:] == clicks.user[:-1]
    stay = (clicks.category[1:] == clicks.category[:-1])[same_user].mean()
    popular = np.bincount(clicks.category) / len(clicks.category)
    assert stay > 0.6 > (popular ** 2).sum() + 0.2, stay  # p_session 0.6, plus returns, against chance
    assert 0.75 < truth["generator_auc"] < 0.99
    assert truth["related_category"][1] == 2 and truth["related_category"][2] == 1


def test_lengths_are_exact_and_the_log_is_its_seed(logs, tmp_path):
    like = LIKE["taobao"].scaled(FRACTION)
    lengths = click_lengths(like, np.random.default_rng(5))
    assert lengths.sum() == like.actions[0][1] and lengths.min() >= 1 and len(lengths) == like.users
    path, _ = logs["tmall"]
    again = str(tmp_path / "again.csv")
    write_like("tmall", again, FRACTION, seed=3)
    digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    assert digest(again) == digest(path)
    write_like("tmall", again, FRACTION, seed=4)
    assert digest(again) != digest(path)
    assert json.load(open(again + ".truth.json"))["seed"] == 4


def test_the_program_and_its_refusals(tmp_path):
    def synthetic(*args):
        return run_program("data.synthetic", *args)

    done = synthetic("--like=tmall", "--fraction=0.001", f"--output={tmp_path / 'log.csv'}")
    like = LIKE["tmall"].scaled(0.001)
    assert done.returncode == 0 and done.stdout.startswith(
        f"{tmp_path / 'log.csv'}: {like.rows:,} rows, {like.users:,} users, {like.items:,} items, "
        f"{like.categories:,} categories, {like.sellers:,} sellers, {like.brands:,} brands in "), done.stderr
    for args, message in [
            (("--like=taobao", "--users=5"), "--like=taobao sets the log's counts, lengths and days itself: drop "
                                             "--users"),
            (("--fraction=0.5",), "--fraction is for --like"),
            (("--sample",), "--sample is for --like"),
            (("--like=amazon",), "--like=amazon: value should be one of <taobao|tmall>")]:
        failed = synthetic(*args, f"--output={tmp_path / 'x.csv'}")
        assert failed.returncode != 0 and message in failed.stderr and len(failed.stderr.strip().splitlines()) == 1, (
            failed.stderr)
    # The same log again replaces the generator's own (its truth file beside it)
    again = synthetic("--like=tmall", "--fraction=0.001", f"--output={tmp_path / 'log.csv'}")
    assert again.returncode == 0 and again.stdout.split(" in ")[0] == done.stdout.split(" in ")[0], again.stderr
    # Issue 59 (6): a file the generator did not write is never replaced; (12) a parent that is a file is named.
    (tmp_path / "mine.csv").write_text("precious user data\n")
    (tmp_path / "afile").write_text("")
    for output, message in [
            (tmp_path / "mine.csv", f"error: --output={tmp_path / 'mine.csv'}: exists and was not written by the "
                                    "generator (no mine.csv.truth.json beside it); give a new path, or remove it "
                                    "yourself"),
            (tmp_path / "afile" / "x.csv", f"error: --output={tmp_path / 'afile' / 'x.csv'}: {tmp_path / 'afile'} "
                                           "is a file, not a directory")]:
        for args in (("--like=taobao", "--fraction=0.0001"), ("--users=10",)):
            failed = synthetic(*args, f"--output={output}")
            assert failed.returncode == 1 and failed.stderr.strip().splitlines() == [message], failed.stderr
    assert (tmp_path / "mine.csv").read_text() == "precious user data\n"


@pytest.mark.parametrize("name", ["taobao", "tmall"])
def test_a_sample_like_log_has_the_real_samples_counts_and_quirks(tmp_path, name):
    """`--sample`: the counts of the real sample in ../shared/data (tests/test_real_samples.py
    compares the two where the samples are found), Tmall's quirks included."""
    from dare_tf.data.generation.like_presets import SAMPLES

    path = str(tmp_path / "log.csv")
    truth = write_like(name, path, seed=0, sample=True)
    like, fmt = SAMPLES[name], FORMATS[name]
    rows = _rows(path, fmt)
    assert len(rows) == like.rows and truth["like"] == f"{name}_sample"
    assert len({r[0] for r in rows}) == like.users
    if name == "tmall":
        assert sum(r[4] == "" for r in rows) == like.empty_brands == 115
        times = [(r[0], r[5]) for r in rows]
        assert any(a[0] == b[0] and a[1] > b[1] for a, b in zip(times, times[1:]))  # a user's rows out of order
        assert [r[0] for r in rows] == sorted((r[0] for r in rows), key=int)  # users still grouped, in order
    clicks = read_clicks(path, fmt)
    assert clicks.rows == like.rows and clicks.bad_lines == 0
