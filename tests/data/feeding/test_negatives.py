"""Negatives drawn like the cascade's candidates (`dare_tf.data.feeding.negatives`), against
brute-force counts."""

import numpy as np
import pytest

from dare_tf.data.feeding.negatives import NegativeSampler, format_negatives, parse_negatives

NUM_ITEMS = 42  # 0 pads, 41 is the out-of-vocabulary item: the catalogue is 1..40


def _sampler(rng, sources, clicks_count=300, candidates=None):
    category = np.zeros(NUM_ITEMS, np.int64)
    category[1:-1] = 1 + (np.arange(40) % 5)  # five categories of 8 items
    category[40] = 6  # an item alone in its category
    clicks = np.zeros(NUM_ITEMS)
    clicks[1:-1] = rng.integers(0, 30, 40)
    clicks[3] = 0  # never clicked: popularity never draws it
    target = rng.integers(1, NUM_ITEMS - 1, clicks_count)
    target[:10] = 40
    positives = {"uid": np.arange(1, clicks_count + 1), "position": rng.integers(1, 9, clicks_count),
                 "target_item": target, "target_category": category[target]}
    return NegativeSampler(positives, sources, category, clicks, candidates), category, clicks


def test_parse_negatives_round_trips_and_names_the_bad_part():
    assert parse_negatives("uniform:1, retrieval:8") == (("uniform", 1), ("retrieval", 8))
    assert parse_negatives("") == ()
    assert format_negatives(parse_negatives("popularity:2,category:3")) == "popularity:2,category:3"
    for text, message in [
        ("nearest:2", "negatives='nearest:2': unknown source 'nearest' in 'nearest:2'; sources: uniform, popularity, "
                      "category, retrieval (written SOURCE:COUNT,...)"),
        ("uniform:0", "negatives='uniform:0': 'uniform:0' needs a count >= 1 (SOURCE:COUNT)"),
        ("uniform", "negatives='uniform': 'uniform' needs a count >= 1 (SOURCE:COUNT)"),
        ("uniform:1,uniform:2", "negatives='uniform:1,uniform:2': source 'uniform' is given twice"),
        ("uniform:60,category:41", "negatives='uniform:60,category:41': 101 negatives per click; at most 100"),
    ]:
        with pytest.raises(ValueError) as e:
            parse_negatives(text)
        assert str(e.value) == message


def test_groups_hold_the_click_first_then_each_sources_negatives(rng):
    candidates = rng.integers(1, NUM_ITEMS - 1, (300, 7))
    sampler, category, _ = _sampler(rng, (("uniform", 2), ("retrieval", 3)), candidates=candidates)
    columns = sampler.epoch(np.random.default_rng(1))
    g = sampler.group
    assert g == 6 and len(columns["label"]) == 300 * g
    grouped = {k: v.reshape(300, g) for k, v in columns.items()}
    assert (grouped["label"] == np.eye(1, g, dtype=np.int32)).all()
    for key in ("uid", "position"):
        assert (grouped[key] == grouped[key][:, :1]).all()  # one history per group
    # every click appears once, with its own category; negatives carry their item's category
    p = sampler.positives
    keys = sorted(zip(grouped["uid"][:, 0], grouped["position"][:, 0], grouped["target_item"][:, 0]))
    assert keys == sorted(zip(p["uid"], p["position"], p["target_item"]))
    assert (grouped["target_category"][:, 1:] == category[grouped["target_item"][:, 1:]]).all()
    assert (grouped["target_item"][:, 1:] != grouped["target_item"][:, :1]).all()
    # retrieval negatives come from the click's own candidate row
    row_of = {(u, q, t): i for i, (u, q, t) in enumerate(zip(p["uid"], p["position"], p["target_item"]))}
    for r in range(300):
        i = row_of[(grouped["uid"][r, 0], grouped["position"][r, 0], grouped["target_item"][r, 0])]
        assert set(grouped["target_item"][r, 3:]) <= set(candidates[i])
    uniform = grouped["target_item"][:, 1:3]
    assert uniform.min() >= 1 and uniform.max() <= NUM_ITEMS - 2
    # seeded: the same epoch twice, another epoch differs
    again = sampler.epoch(np.random.default_rng(1))
    assert all((again[k] == columns[k]).all() for k in columns)
    assert not (sampler.epoch(np.random.default_rng(2))["target_item"] == columns["target_item"]).all()
    both = sampler.epochs(seed=4, count=2)
    assert len(both["label"]) == 2 * 300 * g


def test_popularity_follows_the_click_share_and_category_stays_in_the_category(rng):
    sampler, category, clicks = _sampler(rng, (("popularity", 20), ("category", 20)), clicks_count=2000)
    drawn = sampler.negatives(np.random.default_rng(0))
    target = sampler.positives["target_item"]
    popular = drawn[:, :20]
    counts = np.bincount(popular.ravel(), minlength=NUM_ITEMS)
    assert counts[3] == 0 and counts[0] == 0 and counts[NUM_ITEMS - 1] == 0
    # brute force: click share, renormalised per click without the click itself
    share = clicks / clicks.sum()
    expected = np.zeros(NUM_ITEMS)
    for t in target:
        s = share.copy()
        s[t] = 0
        expected += 20 * s / s.sum()
    observed = counts / counts.sum()
    assert np.abs(observed - expected / expected.sum()).max() < 0.01
    same = drawn[:, 20:]
    alone = target == 40  # item 40 is the only item of its category: popularity instead
    assert (category[same[~alone]] == category[target[~alone]][:, None]).all()
    assert (same[alone] != 40).all() and (clicks[same[alone]] > 0).all()
    # within a category, by clicks + 1
    in_one = same[(~alone) & (category[target] == 2)].ravel()
    members = np.flatnonzero(category == 2)
    weights = clicks[members] + 1.0
    expected = np.zeros(NUM_ITEMS)
    for t in target[(~alone) & (category[target] == 2)]:
        w = np.where(members == t, 0.0, weights)
        expected[members] += 20 * w / w.sum()
    observed = np.bincount(in_one, minlength=NUM_ITEMS)
    assert np.abs(observed / observed.sum() - expected / expected.sum()).max() < 0.02


def test_sampler_refuses_what_it_cannot_draw(rng):
    with pytest.raises(ValueError, match=r"^the retrieval source needs a \[clicks, N\] candidate table for the "
                                         r"300 clicks, got None$"):
        _sampler(rng, (("retrieval", 2),))
    sampler, *_ = _sampler(rng, (("retrieval", 2),), candidates=np.zeros((300, 3), np.int64))
    sampler.candidates = np.repeat(sampler.positives["target_item"][:, None], 3, axis=1)  # nothing else proposed
    with pytest.raises(RuntimeError, match="drew click .* itself as its negative 100 times"):
        sampler.negatives(np.random.default_rng(0))
