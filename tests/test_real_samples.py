"""Checks on the small real samples (../shared/data, or $DARE_TF_SAMPLES), run only where
a checkout finds them: each test skips in one line otherwise (tests/conftest.py's
`real_sample`). Every other test reads the generated logs in the same raw formats
(`data.synthetic --like=taobao|tmall --sample`)."""

import collections
import csv
import hashlib

import numpy as np
import pytest

from dare_tf.data.preparation.in_memory import prepare
from dare_tf.data.preparation.protocol import Protocol
from tests.conftest import SAMPLE_FILES, SAMPLES_DIR, real_sample
from tests.data.preparation.test_prepare import check_protocol, read_split

# sha256 of the Taobao sample's examples at L=200 (seed 1) as the per-example TFRecord
# layout (commit eae56aa) stored them: uid, target_item, target_category, hist_items,
# hist_categories as int64 and label as float32, split by split, users in dense-id
# order (the partitioned shards hold the same examples, grouped by partition).
PER_EXAMPLE_LAYOUT_SHA256 = "08c78cde9022bae6a9c31dff8e46d867b882960fd4bd9eb07583927927d153d5"
# ../shared/data/README.md's table: rows and the users with at least 210 clicks.
FACTS = {"taobao": (94_225, 86), "tmall": (99_806, 120)}


@pytest.fixture(scope="module", params=sorted(SAMPLE_FILES))
def prepared(request, tmp_path_factory):
    name = request.param
    path = real_sample(name)
    out = str(tmp_path_factory.mktemp("real") / name)
    return name, path, out, prepare(name, path, out, Protocol(seed=1))


def test_the_real_samples_prepare_by_the_protocol(prepared):
    name, path, out, spec = prepared
    rows, users = FACTS[name]
    assert (spec.source["rows"], spec.source["bad_lines"]) == (rows, 0)
    check_protocol(out, spec, path, name, users)


def test_taobao_windows_at_200_equal_the_per_example_layout(prepared):
    """The store's L=200 windows are byte for byte what the per-example layout stored."""
    name, _, directory, _ = prepared
    if name != "taobao":
        pytest.skip("the per-example layout's digest is the Taobao sample's")
    digest = hashlib.sha256()
    for split in ("train", "val", "test"):
        _, x = read_split(directory, split)
        order = np.argsort(x["uid"], kind="stable")  # a user's examples keep their order
        for k in ("uid", "target_item", "target_category", "hist_items", "hist_categories"):
            digest.update(x[k][order].astype(np.int64).tobytes())
        digest.update(x["label"][order].astype(np.float32).tobytes())
    assert digest.hexdigest() == PER_EXAMPLE_LAYOUT_SHA256


@pytest.mark.parametrize("name", sorted(SAMPLE_FILES))
def test_the_generated_stand_in_has_the_samples_shape(name):
    """The generated log the tests read has the real sample's rows, users, qualifying users,
    header and actions (Tmall: empty brands, a user's rows out of time order)."""
    from tests.conftest import _SAMPLES

    def shape(path):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        header = rows[0] if name == "tmall" else None
        rows = rows[1:] if header else rows
        action = 6 if name == "tmall" else 3
        click = "0" if name == "tmall" else "pv"
        clicks = collections.Counter(r[0] for r in rows if r[action] == click)
        out = dict(header=header, rows=len(rows), users=len({r[0] for r in rows}),
                   qualifying=sum(n >= 210 for n in clicks.values()),
                   actions=sorted(collections.Counter(r[action] for r in rows)))
        if name == "tmall":
            out["empty_brands"] = sum(r[4] == "" for r in rows) > 0
            out["out_of_order"] = any(a[0] == b[0] and a[5] > b[5] for a, b in zip(rows, rows[1:]))
        return out

    generated = shape(_SAMPLES[name])
    assert (generated["rows"], generated["qualifying"]) == FACTS[name]
    try:
        real = real_sample(name)
    except pytest.skip.Exception:
        return  # (the generated log's own facts are checked; the comparison needs the sample)
    assert generated == shape(real), f"generated {name} log differs from {SAMPLES_DIR}'s"
