"""The history service's stores against one contract: time order, the cap,
unknown users, read-only refusals, atomic appends under concurrent readers, a
killed writer, and one-line errors; LMDB, Redis on a real redis-server started on a
free localhost port, and a Redis Cluster of 3 masters and a replica each."""

import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from dare_tf.histories import CLICK, StoreError, open_store
from dare_tf.testing.redis_server import RedisServer
from tests.programs import run_program

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with RedisServer(str(tmp_path_factory.mktemp("redis"))) as url:
        yield url


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory):
    from dare_tf.testing.redis_cluster import RedisCluster

    with RedisCluster(str(tmp_path_factory.mktemp("cluster"))) as url:
        yield url


@pytest.fixture(params=["lmdb", "redis", "cluster"])
def store_url(request, tmp_path):
    if request.param == "lmdb":
        return f"lmdb:{tmp_path / 'histories'}"
    return emptied(request.getfixturevalue(f"{request.param}_url"))


def emptied(url: str) -> str:
    """The Redis server or cluster at `url`, every key removed."""
    import redis

    if url.startswith("redis-cluster://"):
        from dare_tf.histories.cluster_store import startup_nodes

        redis.RedisCluster(startup_nodes=startup_nodes(url)).flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        redis.Redis.from_url(url).flushall()
    return url


def test_clicks_are_kept_in_time_order_capped_and_unknown_users_are_empty(store_url):
    with open_store(store_url, max_clicks=5) as store:
        assert store.append(7, [1, 2, 3], [10, 20, 30], [100, 200, 300]) == 3
        assert store.append(7, [4], [40], [150]) == 4  # older than the last: inserted in order
        assert store.append(7, [5, 6, 7], [50, 60, 70], [400, 400, 50]) == 5  # the cap drops the oldest
        assert store.append(-3, [9], [90], [1]) == 1
        history = store.last([7, 8, -3], max_len=4)
        np.testing.assert_array_equal(history.items, [[2, 3, 5, 6], [0, 0, 0, 0], [9, 0, 0, 0]])
        np.testing.assert_array_equal(history.categories, [[20, 30, 50, 60], [0, 0, 0, 0], [90, 0, 0, 0]])
        np.testing.assert_array_equal(history.times, [[200, 300, 400, 400], [0, 0, 0, 0], [1, 0, 0, 0]])
        np.testing.assert_array_equal(history.lengths, [4, 0, 1])  # the unknown user 8: empty, no error
        assert store.last([8]).items.shape == (1, 1)  # (always one column: a rank request's T >= 1)
        assert history.to_json(0, 7) == {"user_id": 7, "items": [2, 3, 5, 6], "categories": [20, 30, 50, 60],
                                         "times": [200, 300, 400, 400]}
        assert store.size(7) == 5 and store.size(8) == 0 and sorted(store.users()) == [-3, 7] and len(store) == 2
    with open_store(store_url, max_clicks=99) as again:  # the cap the store was created with
        assert again.max_clicks == 5 and again.last([7]).lengths.tolist() == [5]


def test_a_store_of_string_ids_keeps_and_answers_the_strings(store_url):
    with open_store(store_url, max_clicks=3, fields=("brand",), string_ids=True) as store:
        assert store.append("u-1", ["SKU-1", "SKU-2"], ["shoes", "hats"], [100, 200],
                            {"brand": ["acme", "~SKU-2"]}) == 2
        assert store.append("007", ["SKU-2"], ["hats"], [50], {"brand": ["acme"]}) == 1
        assert store.append("7", ["SKU-3", "SKU-1"], ["shoes", "shoes"], [300, 400], {"brand": ["b", "acme"]}) == 2
        assert store.append("u-1", ["SKU-9", "SKU-1"], ["c", "shoes"], [150, 500], {"brand": ["b", "acme"]}) == 3
        history = store.last(["u-1", "7", "nobody", "007"], max_len=3)
        assert history.items.tolist() == [["SKU-9", "SKU-2", "SKU-1"], ["SKU-3", "SKU-1", ""], ["", "", ""],
                                          ["SKU-2", "", ""]]
        assert history.categories[0].tolist() == ["c", "hats", "shoes"] and history.lengths.tolist() == [3, 2, 0, 1]
        assert history.fields["brand"][0].tolist() == ["b", "~SKU-2", "acme"]
        assert history.times[0].tolist() == [150, 200, 500]
        assert history.to_json(1, "7") == {"user_id": "7", "items": ["SKU-3", "SKU-1"],
                                           "categories": ["shoes", "shoes"], "times": [300, 400],
                                           "brand": ["b", "acme"]}
        assert sorted(store.users()) == ["007", "7", "u-1"] and store.size("7") == 2 and store.size("8") == 0
        for bad, message in ((["SKU\t1"], "items: 'SKU\\t1' holds a control character"),
                             ([7], "items: 7 is not a string"),
                             ([""], "items: '' is empty")):
            with pytest.raises(StoreError, match=re.escape(message)):
                store.append("u-1", bad, ["c"], [1], {"brand": ["b"]})
    with pytest.raises(StoreError, match=re.escape("the store keeps string ids (--string_ids), not integer ids: a "
                                                   "store keeps the ids it was created with")):
        open_store(store_url, string_ids=False)
    with open_store(store_url, read_only=True) as reader:
        assert reader.string_ids and reader.last(["007"]).items.tolist() == [["SKU-2"]]


@pytest.mark.parametrize("kind", ["redis", "cluster", "cluster_confirmed"])
def test_new_string_ids_are_numbered_by_the_batch_and_a_rival_writers_code_is_kept(kind, request, monkeypatch):
    """Many new string ids: numbered in order of first appearance, one INCRBY and one HSET
    of their names a batch (`INTERN_BATCH`), not an INCR and an HSET each (before: three round trips a
    string, 52,707 commands for the live-clicks walkthrough's load into a Redis Cluster,
    11 of its 47 s); a string another writer numbered between this writer's read and its
    write keeps the other's code. (LMDB numbers in process, in one transaction.)"""
    import redis

    from dare_tf.histories import cluster_store, redis_store

    cluster = kind.startswith("cluster")
    store_url = emptied(request.getfixturevalue("cluster_url" if cluster else "redis_url"))
    options = {"cluster": {"wait_replicas": 1}} if kind == "cluster_confirmed" else {}
    with open_store(store_url, string_ids=True, **options) as store:
        nodes = {"target_nodes": "primaries"} if cluster else {}

        def numbering_commands() -> int:  # (INCR, INCRBY and HSET calls on every master)
            stats = store.client.info("commandstats", **nodes)
            return sum(v["calls"] for node in (stats.values() if cluster else [stats]) for k, v in node.items()
                       if k in ("cmdstat_incr", "cmdstat_incrby", "cmdstat_hset"))

        texts = [f"SKU-{k}" for k in range(2_500)] * 2
        monkeypatch.setattr(redis_store, "INTERN_BATCH", 1_000)
        before = numbering_commands()
        codes = store.codes("items", texts)
        assert numbering_commands() - before == 2 * 3  # (three batches)
        np.testing.assert_array_equal(codes, np.tile(np.arange(1, 2_501), 2))
        assert store._texts([1, 2_500]) == ["SKU-0", "SKU-2499"]
        # A rival numbers "SKU-new-1" after this writer read it as new, before its HSETNX.
        rival = redis.Redis.from_url(store_url) if not cluster else store.client
        numbered = redis_store.intern_codes

        def racing(run, *args, **kwargs):
            def sent(commands):
                if commands[0][0] == "HSET":
                    rival.hsetnx(store._meta("ids"), "SKU-new-1", 777_777)
                return run(commands)
            return numbered(sent, *args, **kwargs)

        monkeypatch.setattr(redis_store, "intern_codes", racing)
        monkeypatch.setattr(cluster_store, "intern_codes", racing)
        assert store.codes("items", ["SKU-new-0", "SKU-new-1", "SKU-0"]).tolist() == [2_501, 777_777, 1]
        assert store._texts([2_501, 2_502]) == ["SKU-new-0", "SKU-new-1"]  # (2,502: numbered, then left unused)


def test_equal_times_keep_their_arrival_order(store_url):
    with open_store(store_url) as store:
        store.append(1, [5, 6], [1, 1], [10, 10])
        store.append(1, [7], [1], [10])
        store.append(1, [8], [1], [9])
        assert store.last([1]).items.tolist() == [[8, 5, 6, 7]]


def test_refusals_are_one_line(store_url, redis_url, tmp_path):
    with open_store(store_url) as store:
        for bad, message in [((2**63, [1], [1], [1]), "user_id: 9223372036854775808 does not fit int64"),
                             ((1, [1.5], [1], [1]), "items: expected integers, got 1.5"),
                             ((1, [1, 2], [1], [1, 2]), "append: 2 items, 1 categories and 2 times")]:
            with pytest.raises(StoreError, match="^" + __import__("re").escape(message)):
                store.append(*bad)
        store.append(1, [1], [1], [1])
    with open_store(store_url, read_only=True) as reader:
        with pytest.raises(StoreError, match=r": opened read-only; open it for writing to append$"):
            reader.append(1, [2], [2], [2])
        assert reader.last([1]).items.tolist() == [[1]]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"^lmdb:.*/docs: not a history store \(no data.mdb in .*\); give an empty"):
        open_store(f"lmdb:{tmp_path / 'docs'}")
    assert (tmp_path / "docs" / "notes.txt").read_text() == "mine"  # nothing written there
    with pytest.raises(StoreError, match=r"^redis://127.0.0.1:1: no Redis server answers \(.*refused"):
        open_store("redis://127.0.0.1:1")
    with pytest.raises(StoreError, match=r"^--store='mysql://x': a history store is lmdb:DIR, redis://HOST:PORT or "
                                         r"redis-cluster://HOST:PORT\[,HOST:PORT...\]$"):
        open_store("mysql://x")


def test_readers_never_see_a_half_written_append(store_url):
    """A writer appends batches of 50 clicks of one item each; a concurrent reader
    finds every batch whole or absent."""
    batch, batches = 50, 40
    with open_store(store_url, max_clicks=batch * batches) as store:
        torn, reads = [], [0]
        done, reading = threading.Event(), threading.Event()

        def read():
            with open_store(store_url, read_only=True) if store_url.startswith("redis") else _same(store) as reader:
                while not done.is_set():
                    counts = np.bincount(reader.last([1]).items[0], minlength=batches + 1)[1:]
                    torn.extend(int(c) for c in counts if c not in (0, batch))
                    reads[0] += 1
                    reading.set()

        thread = threading.Thread(target=read)
        thread.start()
        reading.wait(30)  # (on a loaded machine the appends could all end before the reader's first read)
        for b in range(1, batches + 1):
            store.append(1, [b] * batch, [1] * batch, [b] * batch)
        done.set()
        thread.join()
        assert not torn and reads[0] > 0 and store.size(1) == batch * batches


class _same:
    """The writer's own LMDB environment (one per process), read in another thread."""

    def __init__(self, store):
        self.store = store

    def __enter__(self):
        return self.store

    def __exit__(self, *exc):
        pass


WRITER = """
import sys
from dare_tf.histories import open_store
store = open_store(sys.argv[1])
for b in range(1, 100000):
    store.append(1, [b] * 20, [1] * 20, [b] * 20)
    print(b, flush=True)
"""


def test_a_killed_writer_loses_at_most_the_append_it_had_not_returned_from(store_url):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, store_url], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    acknowledged = 0
    while acknowledged < 30:
        acknowledged = int(writer.stdout.readline())
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    with open_store(store_url, read_only=True) as store:
        items = store.last([1]).items[0]
    kept = np.bincount(items, minlength=acknowledged + 2)[1:]
    assert (kept[:acknowledged] == 20).all(), kept  # every acknowledged append is there
    assert set(kept.tolist()) <= {0, 20}, kept  # and none is torn (one more may have committed before the kill)


def test_records_are_raw_int64_triples():
    assert CLICK.itemsize == 24 and CLICK.names == ("time", "item", "category")


def test_a_store_with_fields_keeps_their_values(store_url):
    """A store created with further fields keeps each click's raw values, in time
    order with the click; it is reopened with them, and an append without one of
    them (or with another) is refused in one line naming it."""
    with open_store(store_url, max_clicks=3, fields=("brand", "shop")) as store:
        assert store.fields == ("brand", "shop") and store.dtype.names == ("time", "item", "category", "brand",
                                                                           "shop")
        store.append(4, [1, 2], [10, 20], [300, 100], {"brand": [-2, 7], "shop": [5, 6]})
        store.append(4, [3, 4], [30, 40], [200, 400], {"brand": [8, 9], "shop": [1, 2]})
        history = store.last([4, 5])
        np.testing.assert_array_equal(history.items, [[3, 1, 4], [0, 0, 0]])  # (the cap drops the oldest: item 2)
        np.testing.assert_array_equal(history.fields["brand"], [[8, -2, 9], [0, 0, 0]])
        np.testing.assert_array_equal(history.fields["shop"], [[1, 5, 2], [0, 0, 0]])
        assert history.to_json(0, 4) == {"user_id": 4, "items": [3, 1, 4], "categories": [30, 10, 40],
                                         "times": [200, 300, 400], "brand": [8, -2, 9], "shop": [1, 5, 2]}
        for fields, message in [({"brand": [1]}, "append: the store's clicks have the fields brand, shop; missing "
                                                 "shop"),
                                ({"brand": [1], "shop": [1], "colour": [1]}, "; not in the store: colour"),
                                ({"brand": [1, 2], "shop": [1]}, "append: 1 items, 1 categories and 1 times, 2 brand, "
                                                                 "1 shop; one of each per click")]:
            with pytest.raises(StoreError, match=__import__("re").escape(message)):
                store.append(4, [1], [1], [1], fields)
    with open_store(store_url, read_only=True) as reader:
        assert reader.fields == ("brand", "shop") and reader.last([4]).fields["shop"].tolist() == [[1, 5, 2]]
    with pytest.raises(StoreError, match=r": the store's clicks have the fields \['brand', 'shop'\], not \['brand'\]: "
                                         r"a store keeps the fields it was created with; read shop from the log "
                                         r"too \(a preset's log: --fields=brand,shop; --columns: field:shop=COLUMN\) "
                                         "or use another store$"):
        open_store(store_url, fields=("brand",))
    with pytest.raises(StoreError, match=r": the store's clicks have the fields \['brand', 'shop'\], not \['brand', "
                                         r"'shop', 'colour'\]: a store keeps the fields it was created with; use "
                                         "another store$"):
        open_store(store_url, fields=("brand", "shop", "colour"))
    with open_store(store_url) as plain:  # (no fields asked: the store's)
        assert plain.fields == ("brand", "shop")


def _filled_lmdb(tmp_path):
    """An LMDB store of 200 users of 40 clicks: its directory, its data.mdb and that file's bytes."""
    path = tmp_path / "histories"
    with open_store(f"lmdb:{path}") as store:
        for user in range(200):
            store.append(user, list(range(1, 41)), [3] * 40, list(range(40)))
    return path, path / "data.mdb", (path / "data.mdb").read_bytes()


def test_a_truncated_or_damaged_lmdb_store_is_refused_in_one_line(tmp_path):
    """Issue 45 (5): a truncated data.mdb (`truncate -s 8192`) killed `histories show`
    and `recommend` with SIGBUS; a flipped byte in the config ended in a UTF-8
    decoding error. Both are refused in one line that says the store is damaged."""
    path, data, whole = _filled_lmdb(tmp_path)
    os.truncate(data, 8192)
    with pytest.raises(StoreError, match=f"^lmdb:{path}: the store is damaged: {data} holds 8,192 bytes but its meta "
                                         "page records ([0-9,]+) \\(a truncated copy\\?\\); restore it from a copy, "
                                         "or load it anew with serving.histories load$") as e:
        open_store(f"lmdb:{path}", read_only=True)
    assert int(re.search(r"records ([0-9,]+) ", str(e.value)).group(1).replace(",", "")) == len(whole)
    done = run_program("serving.histories", "show", f"--store=lmdb:{path}", "--user_id=3")
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"error: {e.value}"], done
    # A flipped byte in the store's config: the store is damaged, not a decoding error.
    at = whole.find(b'"format"')
    data.write_bytes(whole[:at + 2] + b"\x9c" + whole[at + 3:])
    with pytest.raises(StoreError, match=f"^lmdb:{path}: the store is damaged \\(UnicodeDecodeError: 'utf-8' codec "
                                         "can't decode byte 0x9c .*\\); restore it from a copy, or load it anew with "
                                         "serving.histories load$"):
        open_store(f"lmdb:{path}", read_only=True)


def test_redis_going_down_during_an_append_is_one_line_with_what_was_appended(tmp_path):
    """Issue 45 (7): Redis stopping during `histories append --input=-` ended in 89
    lines of chained tracebacks; now one line saying how many clicks were appended."""
    import redis
    import time

    server = RedisServer(str(tmp_path))
    url = server.__enter__()
    try:
        appender = subprocess.Popen(
            [sys.executable, "-m", "serving.histories", "append", f"--store={url}", "--input=-",
             "--columns=user=0,item=1,category=2,time=3", "--max_clicks=10"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        appender.stdin.write("1,10,3,100\n2,11,3,101\n1,12,3,102\n")
        appender.stdin.flush()
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60
        while client.strlen("dare:histories:u:1") < 2 * 24 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.__exit__()
    out, err = appender.communicate("3,13,3,103\n", timeout=60)
    assert appender.returncode == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {url}: the Redis server stopped answering ("), err
    assert lines[0].endswith("; 0 of the 1 clicks of standard input (the batch from line 4) were appended before it, "
                             "each user's whole or not at all; 3 clicks of standard input were appended in all"), err


def test_a_damaged_lmdb_store_gets_one_message_from_show_and_append(tmp_path):
    """Issue 59 (7): a flipped byte in a database's name gave `show` "not a history store written by
    dare_tf (MDB_NOTFOUND)" and `append` "the store is damaged (UnicodeDecodeError)"; both now say
    the same line, and `append` opens the store's databases without creating any (it wrote a new
    config into the damaged file). A flipped byte in the config's `max_clicks` key is damage too."""
    path, data, whole = _filled_lmdb(tmp_path)
    log = tmp_path / "one.csv"
    log.write_text("3,5,3,100\n")

    def both():
        out = []
        for args in (["show", "--user_id=3"],
                     ["append", f"--input={log}", "--columns=user=0,item=1,category=2,time=3"]):
            done = run_program("serving.histories", *args, f"--store=lmdb:{path}")
            out.append((done.returncode, done.stderr.strip().splitlines()))
        return out

    names = [m.start() for m in re.finditer(b"clicks", whole)]
    for at in names:  # (copy-on-write leaves older copies of the main database's page: find the live one)
        data.write_bytes(whole[:at] + b"x" + whole[at + 1:])
        show, append = both()
        if show[0]:
            break
    expected = (1, [f"error: lmdb:{path}: the store is damaged, or not a history store written by dare_tf "
                    "(NotFoundError: mdb_dbi_open: MDB_NOTFOUND: No matching key/data pair found); restore it from a "
                    "copy, or load it anew with serving.histories load"])
    assert show == append == expected
    assert data.read_bytes() == whole[:at] + b"x" + whole[at + 1:]  # (append wrote nothing)
    at = whole.rfind(b"max_clicks")
    data.write_bytes(whole[:at] + b"x" + whole[at + 1:])
    show, append = both()
    assert show == append and show[0] == 1 and len(show[1]) == 1, show
    assert show[1][0].startswith(f"error: lmdb:{path}: the store is damaged: its recorded config ")
    assert show[1][0].endswith(" has no max_clicks; restore it from a copy, or load it anew with serving.histories "
                               "load")
