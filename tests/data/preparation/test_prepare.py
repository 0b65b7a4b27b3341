import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from dare_tf.data.feeding.memory import InMemorySplit
from dare_tf.data.feeding.pipeline import make_dataset
from dare_tf.data.preparation.prepared import item_categories
from dare_tf.data.storage.spec import DatasetSpec, SpecError
from dare_tf.data.storage.id_maps import read_id_map
from dare_tf.data.logs.formats import BadLineError
from dare_tf.data.preparation.protocol import Protocol
from dare_tf.data.preparation.in_memory import prepare

from tests.conftest import REPO, TAOBAO_LOG as TAOBAO, TMALL_LOG as TMALL
from tests.data.planted_logs import impression_log, parquet_clicks
from tests.programs import run_program

def read_split(directory, split, max_len=200):
    split_data = InMemorySplit.load(directory, split, max_len=max_len)
    return split_data.columns, {**split_data.features, "label": split_data.columns["label"]}


def raw_click_sequences(path, dataset):
    """Independent recount: each user's clicks (raw item, raw category), in protocol order."""
    seqs = {}
    with open(path, newline="") as f:
        rows = csv.reader(f)
        if dataset == "tmall":
            next(rows)
        for row in rows:
            if dataset == "taobao" and row[3] == "pv":
                seqs.setdefault(row[0], []).append((row[1], row[2], 0))
            elif dataset == "tmall" and row[6] == "0":
                seqs.setdefault(row[0], []).append((row[1], row[2], int(row[5])))
    if dataset == "tmall":
        seqs = {u: sorted(s, key=lambda r: r[2]) for u, s in seqs.items()}  # sorted() is stable
    return seqs


@pytest.fixture(scope="module")
def taobao(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("prep") / "taobao")
    return out, prepare("taobao", TAOBAO, out, Protocol(seed=1))


@pytest.fixture(scope="module")
def tmall(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("prep") / "tmall")
    return out, prepare("tmall", TMALL, out, Protocol(seed=1))


def check_protocol(directory, spec, raw_path, dataset, users_expected, n_check=6):
    assert spec.users == users_expected
    assert spec.counts == {"train": users_expected * 19 * 3, "val": users_expected * 3,
                           "test": users_expected * 3}
    raw_items = read_id_map(directory, "item")
    raw_cats = read_id_map(directory, "category")
    raw_users = read_id_map(directory, "user")
    # Padding row 0, the dense ids, and the out-of-vocabulary row last.
    assert spec.num_items == len(raw_items) + 2 and spec.num_categories == len(raw_cats) + 2
    assert spec.oov_item == spec.num_items - 1
    seqs = raw_click_sequences(raw_path, dataset)
    assert sum(len(s) >= 210 for s in seqs.values()) == users_expected
    for split in ("train", "val", "test"):
        _, ex = read_split(directory, split)
        labels = ex["label"].reshape(-1, 3)
        assert (labels == [1, 0, 0]).all()  # one positive, then its two negatives
        clicked = {u: {r[0] for r in s} for u, s in seqs.items()}
        for i in range(len(ex["label"])):
            if ex["label"][i] == 0:
                user = raw_users[ex["uid"][i] - 1]
                assert raw_items[ex["target_item"][i] - 1] not in clicked[user]
        # History windows of several users recounted from the raw file.
        offsets = {"train": [3 + 5 * j for j in range(19)], "val": [2], "test": [1]}[split]
        for g in range(0, len(ex["label"]) // 3, max(1, len(ex["label"]) // 3 // n_check)):
            row = 3 * g
            user = raw_users[ex["uid"][row] - 1]
            seq = seqs[user]
            pos = len(seq) - offsets[g % len(offsets)]
            assert (raw_items[ex["target_item"][row] - 1], raw_cats[ex["target_category"][row] - 1]) == seq[pos][:2]
            window = seq[max(0, pos - 200): pos]
            hist = [(raw_items[i - 1], raw_cats[c - 1]) for i, c in
                    zip(ex["hist_items"][row], ex["hist_categories"][row]) if i > 0]
            assert hist == [r[:2] for r in window]
            assert (ex["hist_items"][row][: 200 - len(window)] == 0).all()


def test_taobao_sample_follows_protocol(taobao):
    directory, spec = taobao
    check_protocol(directory, spec, TAOBAO, "taobao", 86)
    assert spec.source["rows"] == 94225 and spec.source["bad_lines"] == 0
    assert len(spec.source["sha256"]) == 64


def test_tmall_sample_follows_protocol(tmall):
    directory, spec = tmall
    check_protocol(directory, spec, TMALL, "tmall", 120)
    # The raw file really has unordered rows, empty brand_id and same-day clicks.
    with open(TMALL) as f:
        rows = [line.rstrip("\n").split(",") for line in f][1:]
    assert any(r[4] == "" for r in rows)
    per_user = {}
    for r in rows:
        per_user.setdefault(r[0], []).append(int(r[5]))
    assert any(t != sorted(t) for t in per_user.values())
    assert any(len(set(t)) < len(t) for t in per_user.values())


def log_item_categories(path, dataset):
    """Independent recount: each raw item's raw category on its last click in
    protocol order (users in order of first row, each user's clicks in protocol
    order: `raw_click_sequences`)."""
    last = {}
    for clicks in raw_click_sequences(path, dataset).values():
        for item, category, _ in clicks:
            last[item] = category
    return last


@pytest.mark.parametrize("dataset", ["taobao", "tmall"])
def test_every_item_has_the_category_of_its_last_click(dataset, taobao, tmall):
    """item_categories.txt covers the whole vocabulary, items never clicked by a
    qualifying user included (most of the sample's); the retrieval catalogue and
    the negatives read it. A dataset without the file (an earlier version) falls
    back to the categories its store and examples hold."""
    directory, spec = {"taobao": taobao, "tmall": tmall}[dataset]
    raw_items, raw_cats = read_id_map(directory, "item"), read_id_map(directory, "category")
    category = item_categories(directory, spec, None)
    assert category.shape == (spec.num_items,) and category[0] == category[-1] == spec.oov_category
    expected = log_item_categories({"taobao": TAOBAO, "tmall": TMALL}[dataset], dataset)
    assert len(expected) == len(raw_items)
    assert [raw_cats[c - 1] for c in category[1:-1]] == [expected[r] for r in raw_items]
    store_items = set()
    for split in ("train", "val", "test"):
        columns, features = read_split(directory, split)
        store_items.update(features["hist_items"].ravel().tolist(), features["target_item"].tolist())
    assert len(raw_items) - len(store_items - {0}) > len(raw_items) // 2  # most items: only the map knows them


def test_item_category_file_that_does_not_fit_is_refused(tmp_path, caplog):
    out = str(tmp_path / "out")
    spec = prepare("taobao", write(tmp_path, "log.csv", GOOD), out, Protocol(min_clicks=20, train_targets=2))
    path = os.path.join(out, "item_categories.txt")
    lines = open(path).read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")
    with pytest.raises(SpecError, match=f"^{path}: {len(lines) - 1} lines, expected one per item "
                       f"\\({len(lines)}, spec.json's num_items - 2\\)$"):
        item_categories(out, spec, None)
    with open(path, "w") as f:
        f.write("\n".join(lines[:2] + ["x7"] + lines[3:]) + "\n")
    with pytest.raises(SpecError, match=f"^{path}:3: expected a dense category id in \\[1, "
                       f"{spec.num_categories - 2}\\], got 'x7'$"):
        item_categories(out, spec, None)
    os.remove(path)  # prepared by an earlier version: what the data hold, and a warning
    category = item_categories(out, spec, lambda: [(np.array([2, 5]), np.array([1, 3]))])
    assert category.tolist() == [spec.oov_category, spec.oov_category, 1, spec.oov_category, spec.oov_category, 3] \
        + [spec.oov_category] * (spec.num_items - 6)
    assert f"{out} has no item_categories.txt (prepared by an earlier version): {spec.num_items - 4} of " \
        f"{spec.num_items - 2} items have no category" in caplog.text


def test_same_seed_identical_other_seed_changes_negatives_only(taobao, tmp_path):
    directory, _ = taobao
    again = str(tmp_path / "again")
    other = str(tmp_path / "other")
    prepare("taobao", TAOBAO, again, Protocol(seed=1))
    prepare("taobao", TAOBAO, other, Protocol(seed=2))
    assert DatasetSpec.load(again).preparation == DatasetSpec.load(directory).preparation
    assert DatasetSpec.load(other).preparation != DatasetSpec.load(directory).preparation
    for split in ("train", "val", "test"):
        a, _ = read_split(directory, split)
        b, _ = read_split(again, split)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        _, x = read_split(directory, split)
        _, y = read_split(other, split)
        neg = x["label"] == 0
        for k in ("uid", "label", "hist_items", "hist_categories"):
            np.testing.assert_array_equal(x[k], y[k])
        np.testing.assert_array_equal(x["target_item"][~neg], y["target_item"][~neg])
        assert (x["target_item"][neg] != y["target_item"][neg]).mean() > 0.9


def test_pipeline_reads_back_what_was_written(taobao):
    directory, spec = taobao
    _, written = read_split(directory, "val")
    batches = list(make_dataset(directory, "val", batch_size=50, deterministic=True))
    assert [len(b[1]) for b in batches] == [50] * 5 + [8]
    feats = {k: np.concatenate([b[0][k].numpy() for b in batches]) for k in batches[0][0]}
    labels = np.concatenate([b[1].numpy() for b in batches])
    np.testing.assert_array_equal(labels, written["label"])
    for k, v in feats.items():
        np.testing.assert_array_equal(v, written[k])
    # Shuffled training input holds the same examples, in a different order.
    train = list(make_dataset(directory, "train", batch_size=1000, deterministic=True, seed=3))
    items = np.concatenate([b[0]["target_item"].numpy() for b in train])
    _, written_train = read_split(directory, "train")
    assert sorted(items) == sorted(written_train["target_item"])
    assert not np.array_equal(items, written_train["target_item"])
    again = np.concatenate([b[0]["target_item"].numpy() for b in make_dataset(
        directory, "train", batch_size=1000, deterministic=True, seed=3)])
    np.testing.assert_array_equal(items, again)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


GOOD = "".join(f"{u},{i},{i % 3},pv,{1511500000 + i}\n" for u in (1, 2) for i in range(10 * u, 10 * u + 30)) \
    + "3,500,1,pv,1511500000\n"


@pytest.mark.parametrize("bad,message", [
    ("7,8,9,pv\n", "expected 5 comma-separated fields, got 4"),
    ("7,8,9,pv,1,2\n", "expected 5 comma-separated fields, got 6"),
    ("7,x8,9,pv,1\n", "item (column '1') is not an integer: 'x8'"),
    ("7,8,9,click,1\n", "unknown action (column '3') 'click'"),
    ("7,99999999999999999999,9,pv,1\n", "item (column '1') = 99999999999999999999 does not fit a 64-bit integer"),
    ("7,8,-9,pv,1\n", "category (column '2') is negative: '-9'"),
])
def test_bad_taobao_line_names_file_line_and_content(tmp_path, bad, message):
    lines = GOOD.splitlines(keepends=True)
    path = write(tmp_path, "log.csv", "".join(lines[:5] + [bad] + lines[5:]))
    with pytest.raises(BadLineError) as err:
        prepare("taobao", path, str(tmp_path / "out"), Protocol(min_clicks=20, train_targets=2))
    assert f"{path}:6: {message}" in str(err.value)
    assert repr(bad.strip()) in str(err.value)
    assert not os.path.exists(tmp_path / "out")
    spec = prepare("taobao", path, str(tmp_path / "out"), Protocol(min_clicks=20, train_targets=2),
                   skip_bad_lines=True, max_bad_share=0.05)  # (1 of 62 lines)
    assert spec.source["bad_lines"] == 1 and spec.users == 2


def test_bad_tmall_action_and_header(tmp_path):
    header = "user_id,item_id,cat_id,seller_id,brand_id,time_stamp,action_type\n"
    body = "".join(f"{u},{i},{i % 3},5,,{1100 + i},0\n" for u in (1, 2) for i in range(10 * u, 10 * u + 30))
    path = write(tmp_path, "log.csv", header + body + "3,4,5,6,7,1101,9\n")
    with pytest.raises(BadLineError, match=r"log.csv:62: unknown action \(column 'action_type'\) '9'"):
        prepare("tmall", path, str(tmp_path / "o"), Protocol(min_clicks=20, train_targets=2))
    path = write(tmp_path, "nohead.csv", body)
    with pytest.raises(ValueError, match=r"nohead.csv:1: expected the tmall header"):
        prepare("tmall", path, str(tmp_path / "o"), Protocol(min_clicks=20, train_targets=2))


def test_missing_empty_and_no_qualifying_users(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv: input log not found"):
        prepare("taobao", str(tmp_path / "nope.csv"), str(tmp_path / "o"))
    with pytest.raises(ValueError, match="empty.csv: input log is empty"):
        prepare("taobao", write(tmp_path, "empty.csv", ""), str(tmp_path / "o"))
    with pytest.raises(ValueError, match="no user has >= 210 clicks \\(the longest history has 30 clicks\\)"):
        prepare("taobao", write(tmp_path, "short.csv", GOOD), str(tmp_path / "o"))
    with pytest.raises(ValueError, match="^min_clicks=5: must be >= 94 so that the earliest train target has a "
                                         "history \\(train_targets=19 targets, one every stride=5 clicks, reach 92 "
                                         "clicks back\\); raise --min_clicks, or lower --train_targets or --stride$"):
        prepare("taobao", write(tmp_path, "short.csv", GOOD), str(tmp_path / "o"), Protocol(min_clicks=5))
    assert not os.path.exists(tmp_path / "o")


def test_rewrite_replaces_old_shards_and_failure_keeps_old(tmp_path, monkeypatch):
    path = write(tmp_path, "log.csv", GOOD)
    out = str(tmp_path / "out")
    prepare("taobao", path, out, Protocol(min_clicks=20, train_targets=2, partitions=4))
    assert len(os.listdir(out)) == 5 + 4 * 4
    spec = prepare("taobao", path, out, Protocol(min_clicks=20, train_targets=2, partitions=1))
    assert sorted(os.listdir(out)) == sorted(
        ["spec.json", "item_ids.txt", "category_ids.txt", "user_ids.txt", "item_categories.txt",
         "store-00000-of-00001.tfrecord.gz",
         "train-00000-of-00001.tfrecord.gz", "val-00000-of-00001.tfrecord.gz", "test-00000-of-00001.tfrecord.gz"])
    import dare_tf.data.preparation.in_memory as in_memory

    def boom(*args, **kwargs):
        raise RuntimeError("killed midway")
    monkeypatch.setattr(in_memory.PartitionedWriter, "write_examples", boom)
    with pytest.raises(RuntimeError, match="killed midway"):
        prepare("taobao", path, out, Protocol(min_clicks=20, train_targets=2, seed=9))
    assert DatasetSpec.load(out) == spec
    assert sorted(os.listdir(tmp_path)) == ["log.csv", "out"]  # no staging directory left


def test_command_line(tmp_path):
    out = str(tmp_path / "cli")
    result = run_program("data.prepare", "--dataset=taobao", f"--input={TAOBAO}", f"--output_dir={out}", "--seed=4")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "86 users" in result.stdout
    assert DatasetSpec.load(out).protocol["seed"] == 4


def test_a_protocol_that_keeps_under_half_the_users_says_what_lower_settings_keep(tmp_path):
    """Issue 69 (8): choosing --min_clicks/--train_targets for a log of a median of 40 clicks
    per user took guessing. Where fewer than half of the log's users are kept, data.prepare
    says how many each lower --train_targets (with the least --min_clicks it allows: 4 +
    stride * (targets - 1)) would keep, counted here by hand from the log."""
    per_user = [5, 10, 12, 20, 30, 40, 50, 60, 100, 250]
    log = tmp_path / "log.csv"
    log.write_text("".join(f"{u},{u * 1000 + k},{k % 5 + 1},pv,{1_500_000_000 + k}\n"
                           for u, n in enumerate(per_user, 1) for k in range(n)))
    out = tmp_path / "prepared"
    done = run_program("data.prepare", "--dataset=taobao", f"--input={log}", f"--output_dir={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == (
        "kept 1 of the log's 10 users (>= --min_clicks=210 clicks; the median user has 30); more with "
        "--train_targets=19 --min_clicks=94: 2 users, --train_targets=9 --min_clicks=44: 4 users, "
        "--train_targets=4 --min_clicks=19: 7 users, --train_targets=2 --min_clicks=9: 9 users, "
        "--train_targets=1 --min_clicks=4: 10 users"), done.stdout[-2000:]
    assert DatasetSpec.load(str(out)).source["users_by_clicks"] == {"clicks": sorted(per_user), "users": [1] * 10}
    # Half kept or more: nothing said; --split=time: lower --min_clicks at the median and the lower quartile.
    from dare_tf.data.preparation.protocol import choices_line, users_by_clicks

    distribution = users_by_clicks(per_user)
    assert choices_line(distribution, Protocol(min_clicks=12, train_targets=2), 8) is None
    assert choices_line(distribution, Protocol(split="time", min_clicks=100), 2) == (
        "kept 2 of the log's 10 users (>= --min_clicks=100 clicks; the median user has 30); more with "
        "--min_clicks=30: 6 users, --min_clicks=12: 8 users")


# -- issue 10: never delete what preparation did not write -----------------------------------

def _small(tmp_path):
    return write(tmp_path, "log.csv", GOOD), Protocol(min_clicks=20, train_targets=2)


def test_refuses_a_directory_with_other_files_and_keeps_them(tmp_path):
    from dare_tf._files import OutputDirError

    path, protocol = _small(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(OutputDirError,
                       match=r"mine is not empty and is not a dataset prepared by dare_tf.*'notes.txt'"):
        prepare("taobao", path, str(out), protocol)
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["log.csv", "mine"]


def test_refuses_the_input_logs_own_folder_and_a_file(tmp_path):
    from dare_tf._files import OutputDirError

    path, protocol = _small(tmp_path)
    with pytest.raises(OutputDirError, match="contains the input log"):
        prepare("taobao", path, str(tmp_path), protocol)
    assert os.path.exists(path)
    target = tmp_path / "afile"
    target.write_text("x")
    with pytest.raises(OutputDirError, match="afile exists and is not a directory"):
        prepare("taobao", path, str(target), protocol)
    assert target.read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["afile", "log.csv"]  # no NAME.old-* left behind


def test_replaces_its_own_dataset_but_not_one_with_extra_files(tmp_path):
    from dare_tf._files import OutputDirError

    path, protocol = _small(tmp_path)
    out = tmp_path / "out"
    prepare("taobao", path, str(out), protocol)
    prepare("taobao", path, str(out), protocol)  # its own: replaced
    (out / "analysis.ipynb").write_text("{}")
    with pytest.raises(OutputDirError, match="holds files preparation did not write: 'analysis.ipynb'"):
        prepare("taobao", path, str(out), protocol)
    assert (out / "analysis.ipynb").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare("taobao", path, str(empty), protocol)  # empty: fine
    assert DatasetSpec.load(str(empty)).counts


def test_a_symlinked_output_dir_stays_a_link_to_the_new_dataset(tmp_path):
    path, protocol = _small(tmp_path)
    real, link = tmp_path / "real", tmp_path / "link"
    prepare("taobao", path, str(real), protocol)
    link.symlink_to(real)
    spec = prepare("taobao", path, str(link), Protocol(min_clicks=20, train_targets=2, seed=7))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert DatasetSpec.load(str(real)) == spec and spec.protocol["seed"] == 7
    assert sorted(os.listdir(tmp_path)) == ["link", "log.csv", "real"]  # no staging or .old-* left


def test_stale_staging_of_a_dead_process_is_removed_live_ones_kept(tmp_path):
    path, protocol = _small(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".out.tmp-{dead}-0123abcd"
    stale.mkdir()
    (stale / "train-00000.npz").write_bytes(b"x" * 100)
    live = tmp_path / f".out.tmp-{os.getppid()}-89abcdef"
    live.mkdir()
    other = tmp_path / f".other.tmp-{dead}-0123abcd"
    other.mkdir()
    prepare("taobao", path, str(tmp_path / "out"), protocol)
    assert not stale.exists()
    assert live.exists() and other.exists()


def test_blank_lines_at_the_end_are_accepted(tmp_path):
    path = write(tmp_path, "log.csv", GOOD + "\n\n  \n")
    spec = prepare("taobao", path, str(tmp_path / "out"), Protocol(min_clicks=20, train_targets=2))
    reference = prepare("taobao", write(tmp_path, "clean.csv", GOOD), str(tmp_path / "clean"),
                        Protocol(min_clicks=20, train_targets=2))
    assert spec.counts == reference.counts and spec.source["rows"] == reference.source["rows"]
    with pytest.raises(BadLineError, match=r"log2.csv:2: expected 5 comma-separated fields, got an empty line"):
        prepare("taobao", write(tmp_path, "log2.csv", GOOD.splitlines()[0] + "\n\n" + GOOD),
                str(tmp_path / "out2"))


@pytest.mark.slow
def test_command_line_errors_are_one_line(tmp_path):
    cases = [
        (["--dataset=taobao", f"--input={tmp_path}/nope.csv", f"--output_dir={tmp_path}/o"], 1, "input log not found"),
        (["--dataset=taobao", f"--input={TAOBAO}", f"--output_dir={tmp_path}/o", "--min_clicks=3"], 2,
         "--min_clicks=3: must be >="),
        (["--dataset=taobao", f"--input={TAOBAO}", f"--output_dir={os.path.dirname(TAOBAO)}"], 1,
         "contains the input log"),
    ]
    for args, code, message in cases:
        result = run_program("data.prepare", *args)
        assert result.returncode == code, result.stderr
        lines = result.stderr.strip().splitlines()
        assert "Traceback" not in result.stderr and lines[-1].startswith("error: ") and message in lines[-1], lines


# -- issue 15: one sequence store, any history length ------------------------------------

def test_any_history_length_from_one_preparation(taobao):
    directory, spec = taobao
    assert len(spec.store) == spec.partitions == 16 and spec.clicks_stored == sum(
        n for n in (len(s) for s in raw_click_sequences(TAOBAO, "taobao").values()) if n >= 210)
    raw_items = read_id_map(directory, "item")
    seqs = raw_click_sequences(TAOBAO, "taobao")
    raw_users = read_id_map(directory, "user")
    short, _ = read_split(directory, "test", max_len=200)
    for max_len in (50, 5000):
        columns, x = read_split(directory, "test", max_len=max_len)
        assert x["hist_items"].shape == (len(columns["uid"]), max_len)
        for row in range(0, len(columns["uid"]), 17):
            seq = seqs[raw_users[columns["uid"][row] - 1]]
            window = [r[0] for r in seq[max(0, len(seq) - 1 - max_len): len(seq) - 1]]
            assert [raw_items[i - 1] for i in x["hist_items"][row] if i] == window
        if max_len > 200:  # longer than every history: left-padded, the last 200 slots as at L=200
            _, at200 = read_split(directory, "test", max_len=200)
            np.testing.assert_array_equal(x["hist_items"][:, -200:], at200["hist_items"])
            assert (x["hist_items"][:, : max_len - max(len(s) for s in seqs.values())] == 0).all()
    batch = next(iter(make_dataset(directory, "val", 8, max_len=1000)))[0]
    assert batch["hist_items"].shape == (8, 1000)
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"max_len must be a positive integer .*got {bad}"):
            make_dataset(directory, "val", 8, max_len=bad)


def test_store_and_examples_of_other_preparations_and_truncated_shards_are_refused(tmp_path):
    import json
    import shutil

    from dare_tf.data.storage.store import ShardError

    path, protocol = _small(tmp_path)
    protocol = Protocol(min_clicks=20, train_targets=2, partitions=1)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    prepare("taobao", path, a, protocol)
    # Another preparation: another seed, and a log with one more click (the store
    # does not depend on the seed; the same bytes would be the same store).
    prepare("taobao", write(tmp_path, "log_b.csv", GOOD + "1,77,1,pv,1511600000\n"), b,
            Protocol(min_clicks=20, train_targets=2, partitions=1, seed=5))
    preparation = DatasetSpec.load(a).preparation
    for name in ("train-00000-of-00001.tfrecord.gz", "store-00000-of-00001.tfrecord.gz"):
        mixed = str(tmp_path / f"mixed-{name}")
        shutil.copytree(a, mixed)
        shutil.copy(os.path.join(b, name), os.path.join(mixed, name))
        with pytest.raises(ShardError, match=f"{name}: shard('s sha256 .* is not the .* that| has \\d+ bytes, but) "
                                             f"spec.json \\(preparation {preparation}\\) records.* or comes from "
                                             "another preparation"):
            list(make_dataset(mixed, "train", 4))
    truncated = str(tmp_path / "truncated")
    shutil.copytree(a, truncated)
    shard = os.path.join(truncated, "val-00000-of-00001.tfrecord.gz")
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(ShardError, match=f"{shard}: shard has {size - 10} bytes, but spec.json .* records {size}: "
                                         "it was cut short or comes from another preparation"):
        make_dataset(truncated, "val", 4)
    # Cut short, and spec.json made to agree: the reader itself names it (gzip's stream cut short).
    from dare_tf._files import file_sha256

    spec_path = os.path.join(truncated, "spec.json")
    raw = json.load(open(spec_path))
    raw["files"]["val-00000-of-00001.tfrecord.gz"].update(bytes=size - 10, sha256=file_sha256(shard))
    json.dump(raw, open(spec_path, "w"))
    with pytest.raises(ShardError, match=f"{shard}: not a complete GZIP TFRecord file of val records "
                                         "\\(EOFError: Compressed file ended before the end-of-stream marker "
                                         "was reached\\); prepare the dataset again"):
        make_dataset(truncated, "val", 4)
    missing = str(tmp_path / "missing")
    shutil.copytree(a, missing)
    os.remove(os.path.join(missing, "store-00000-of-00001.tfrecord.gz"))
    with pytest.raises(ShardError, match="store-00000-of-00001.tfrecord.gz: shard listed in .*spec.json is missing"):
        make_dataset(missing, "val", 4)
    legacy = tmp_path / "legacy"
    shutil.copytree(a, legacy)
    spec_path = legacy / "spec.json"
    spec_path.write_text(spec_path.read_text().replace("dare_tf.prepared/3", "dare_tf.prepared/2"))
    with pytest.raises(ValueError, match="is not 'dare_tf.prepared/3' \\(TFRecord store and examples\\); prepare"):
        DatasetSpec.load(str(legacy))
    prepare("taobao", path, str(legacy), protocol)  # an older dataset of ours may be replaced


def parsed_records(path, compression="GZIP"):
    """Every record of a TFRecord file as {feature: list of ints}."""
    import tensorflow as tf

    out = []
    for record in tf.data.TFRecordDataset([path], compression_type=compression):
        example = tf.train.Example.FromString(record.numpy())
        out.append({k: list(v.int64_list.value) for k, v in sorted(example.features.feature.items())})
    return out


def assert_same_datasets(a, b):
    """spec (but its path), id maps and every record of every shard equal: each shard is
    the file its spec.json's sha256 says, so equal specs are the same records, byte for
    byte (a shard whose sha256 differs has its records compared first, to name it and
    show them)."""
    from dare_tf.data.storage.records import check_file

    spec_a, spec_b = DatasetSpec.load(a), DatasetSpec.load(b)
    for name, entry in spec_a.files.items():
        check_file(a, name, spec_a)
        if entry != spec_b.files.get(name) and os.path.exists(os.path.join(b, name)):
            assert parsed_records(os.path.join(a, name)) == parsed_records(os.path.join(b, name)), name
    for name in spec_b.files:
        check_file(b, name, spec_b)
    assert spec_a == spec_b
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for name in names:
        if ".tfrecord" not in name and name != "spec.json":
            assert open(os.path.join(a, name)).read() == open(os.path.join(b, name)).read(), name


def test_the_beam_driver_leaves_no_temporary_folder_behind(tmp_path, monkeypatch):
    """Apache Beam makes temporary folders it never removes (three a DirectRunner
    pipeline, empty, in the system's temporary directory: its environment's and its
    job server's); the driver has them made in its own work folder, removed with it."""
    import tempfile

    from dare_tf.data.preparation import beam as beam_driver

    temp = tmp_path / "system-temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    fmt, log, protocol = impression_log(tmp_path)
    beam_driver.prepare(fmt, log, str(tmp_path / "out"), protocol, block_bytes=4096, buckets=2)
    assert sorted(os.listdir(temp)) == [] and tempfile.gettempdir() == str(temp)
    assert "spec.json" in os.listdir(tmp_path / "out") and ".beam-work" not in os.listdir(tmp_path / "out")


@pytest.mark.slow
def test_beam_pipeline_writes_what_the_in_memory_path_writes(taobao, tmp_path):
    """The Apache Beam driver (DirectRunner) against the in-memory one, record for
    record: spec, id maps, and every record of every store and example shard;
    several partitions and blocks, the command line's --runner=beam, a custom
    TSV impression log and a Parquet click log without categories."""
    from dare_tf.data.preparation import beam as beam_driver
    from dare_tf.data.logs.formats import BadLineError

    protocol = Protocol(seed=1, partitions=4)
    prepare("taobao", TAOBAO, str(tmp_path / "memory"), protocol)
    out = str(tmp_path / "beam")
    result = run_program("data.prepare", "--dataset=taobao", f"--input={TAOBAO}", f"--output_dir={out}",
                         "--runner=beam", "--seed=1", "--partitions=4", "--beam_buckets=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_datasets(str(tmp_path / "memory"), out)
    assert len(DatasetSpec.load(out).shards["train"]) == 4
    impressions, clicks = impression_log(tmp_path, "tsv"), parquet_clicks(tmp_path)
    for name, (fmt, log, proto) in {"imp": impressions, "parquet": clicks}.items():
        prepare(fmt, log, str(tmp_path / f"{name}-memory"), proto)
        beam_driver.prepare(fmt, log, str(tmp_path / f"{name}-beam"), proto, block_bytes=4096, buckets=2)
        assert_same_datasets(str(tmp_path / f"{name}-memory"), str(tmp_path / f"{name}-beam"))
    bad = write(tmp_path, "bad.csv", GOOD + "7,8,9,pv\n")
    with pytest.raises(BadLineError, match=r"bad.csv:62: expected 5 comma-separated fields, got 4"):
        beam_driver.prepare("taobao", bad, str(tmp_path / "bad"), Protocol(min_clicks=20, train_targets=2))
    huge = write(tmp_path, "huge.csv", GOOD + "7,99999999999999999999,9,pv,1\n")
    with pytest.raises(BadLineError, match=r"huge.csv:62: item \(column '1'\) = 99999999999999999999 does not fit"):
        beam_driver.prepare("taobao", huge, str(tmp_path / "bad"), Protocol(min_clicks=20, train_targets=2))
    # the program: Beam's own traceback is not printed, the error is one line
    failed = run_program("data.prepare", "--dataset=taobao", f"--input={bad}", f"--output_dir={tmp_path / 'bad'}",
                         "--runner=beam", "--min_clicks=20", "--train_targets=2")
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert failed.stderr.strip().splitlines() == [
        f"error: {bad}:62: expected 5 comma-separated fields, got 4: '7,8,9,pv' (use --skip_bad_lines to skip and "
        "count such lines) [while running 'Parse']"], failed.stderr[-3000:]
    spec = beam_driver.prepare("taobao", huge, str(tmp_path / "skipped"), Protocol(min_clicks=20, train_targets=2),
                               skip_bad_lines=True, max_bad_share=0.05)  # (1 of 62 lines)
    assert spec.source["bad_lines"] == 1
    assert not os.path.exists(tmp_path / "bad")


def test_beam_regroups_users_from_several_buckets_into_several_chunk_groups(tmp_path):
    """More qualifying users than one chunk (256) and several buckets: each chunk
    group is gathered from every bucket's files, and the chunks draw the
    in-memory driver's negatives, record for record."""
    from dare_tf.data.generation.synthetic import SyntheticConfig, write as write_log
    from dare_tf.data.preparation import beam as beam_driver

    log = str(tmp_path / "log.csv")
    write_log(SyntheticConfig(users=560, items=400, categories=20, min_length=22, max_length=30, length_median=25,
                              seed=3), log)
    protocol = Protocol(min_clicks=20, train_targets=2, stride=2, partitions=3, seed=2)
    memory = prepare("taobao", log, str(tmp_path / "memory"), protocol)
    assert memory.users > 2 * 256
    beam_driver.prepare("taobao", log, str(tmp_path / "beam"), protocol, block_bytes=100_000, buckets=3)
    assert_same_datasets(str(tmp_path / "memory"), str(tmp_path / "beam"))


def test_preparation_loads_neither_tensorflow_nor_keras(tmp_path):
    """A whole preparation (the TFRecord files included) runs on numpy, pyarrow and
    google-crc32c: TensorFlow's runtime alone is ~0.6 GB."""
    code = ("import sys, data.prepare, dare_tf.data.preparation.beam; "
            "from dare_tf.data.preparation.protocol import Protocol; "
            "from dare_tf.data.preparation.in_memory import prepare; "
            f"prepare('taobao', {TAOBAO!r}, {str(tmp_path / 'out')!r}, Protocol(partitions=2)); "
            "print(sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert DatasetSpec.load(str(tmp_path / "out")).counts["test"] == 86 * 3


def test_many_partitions_under_a_low_open_file_limit(tmp_path):
    """4 x 100 shard files open at once with a soft limit of 128: the limit is
    raised within the hard one; a hard limit too low is named with the flag."""
    code = ("import resource, sys; from dare_tf.data.preparation.protocol import Protocol; "
            "from dare_tf.data.preparation.in_memory import prepare; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (128, int(sys.argv[1]))); "
            f"s = prepare('taobao', {TAOBAO!r}, sys.argv[2], Protocol(partitions=100)); "
            "print(len(s.store), sum(s.records(n) for n in s.store))")
    ok = subprocess.run([sys.executable, "-c", code, "4096", str(tmp_path / "ok")], cwd=REPO, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.split() == ["100", "86"]
    low = subprocess.run([sys.executable, "-c", code, "200", str(tmp_path / "low")], cwd=REPO, capture_output=True,
                         text=True)
    assert "ValueError: partitions=100: the in-memory driver writes 400 shard files at once, but this process may " \
           "open 200; lower --partitions or use --runner=beam" in low.stderr
    assert not os.path.exists(tmp_path / "low")


def test_a_user_who_clicked_every_item_is_named(tmp_path):
    log = write(tmp_path, "all.csv", "".join(f"{u},{i},1,pv,{1511500000 + i}\n" for u in (7, 8) for i in range(30)))
    with pytest.raises(ValueError, match="user with dense id 1 clicked every item of the log, so no negative"):
        prepare("taobao", log, str(tmp_path / "out"), Protocol(min_clicks=20, train_targets=2))
    assert not os.path.exists(tmp_path / "out")
