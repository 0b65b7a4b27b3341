"""dare_tf.histories.cluster_store, issue 61 (1, 2): histories on a real Redis Cluster
(3 masters and a replica each, redis-server processes on free localhost ports):
a prepared dataset loads user for user as into LMDB, spread over the shards, through
`serving.histories`; an append acknowledged on a master and its replica (WAIT) is
present exactly once after that master is killed with -9 and its replica takes over,
after a replica is killed (the appender ends in one line with its counts), and after
the whole cluster is killed and started again from its append-only files."""

import json
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import redis

from dare_tf.histories import StoreError, open_store
from dare_tf.histories.cluster_store import startup_nodes
from dare_tf.testing.redis_cluster import ClickAppender, RedisCluster
from tests.conftest import REPO
from tests.programs import run_program

pytestmark = pytest.mark.slow


def program(*args):
    done = run_program("serving.histories", *args, env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_dataset_loads_into_the_cluster_user_for_user_as_into_lmdb(taobao, tmp_path):
    with RedisCluster(str(tmp_path / "cluster")) as url:
        from dare_tf.histories.prepared import load_prepared

        lmdb = f"lmdb:{tmp_path / 'histories'}"
        with open_store(lmdb) as store:  # (in process: the program's load is tested with LMDB; both whole histories)
            load_prepared(store, taobao)
        out = program("load", f"--data_dir={taobao}", f"--store={url}", "--wait_replicas=1")
        assert out.splitlines()[-1] == ("acknowledged: each user's clicks on the master of its slot and on 1 of its "
                                        "replicas (WAIT 1); 0 transient cluster errors retried"), out
        with open_store(lmdb, read_only=True) as a, open_store(url, read_only=True) as b:
            users = sorted(a._users())
            assert sorted(b._users()) == users and len(b) == len(a) > 50
            for user in users:
                x, y = a.last([user]), b.last([user])
                for name in ("items", "categories", "times", "lengths"):
                    np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=f"{user} {name}")
        client = redis.RedisCluster(startup_nodes=startup_nodes(url))
        sizes = [client.dbsize(target_nodes=node) for node in client.get_primaries()]
        assert len(sizes) == 3 and min(sizes) > 5, sizes  # the users spread over every shard
        user = users[0]
        assert program("show", f"--store={url}", f"--user_id={user}") == program(
            "show", f"--store={lmdb}", f"--user_id={user}")


def test_a_malformed_or_unreachable_cluster_is_refused_in_one_line():
    with pytest.raises(StoreError) as e:
        open_store("redis-cluster://nowhere")
    assert str(e.value) == ("--store='redis-cluster://nowhere': 'nowhere' is not HOST:PORT; expected "
                            "redis-cluster://HOST:PORT[,HOST:PORT...]")
    with pytest.raises(StoreError) as e:
        open_store("redis-cluster://127.0.0.1:1")
    assert str(e.value).startswith("redis-cluster://127.0.0.1:1: no node of a Redis Cluster answers (")
    assert "\n" not in str(e.value)


def test_a_cluster_node_given_as_a_plain_redis_is_named_at_once(taobao, tmp_path):
    """Issue 68 (3): `load --store=redis://<a cluster node>` says what the node is, in one line."""
    with RedisCluster(str(tmp_path / "cluster")) as url:
        node = startup_nodes(url)[0]
        plain = f"redis://{node.host}:{node.port}"
        done = run_program("serving.histories", "load", f"--data_dir={taobao}", f"--store={plain}")
        assert done.returncode == 1
        assert done.stderr.strip() == (f"error: {plain}: is a Redis Cluster node; use redis-cluster://{node.host}:"
                                       f"{node.port} (any of its nodes)")


def exactly_once(appender: ClickAppender, url: str) -> None:
    lost, duplicated = appender.lost_and_duplicated(url)
    assert lost == [] and duplicated == 0, (lost[:5], duplicated)


class _LateNode(RedisCluster):
    """A cluster whose last node does not answer (SIGSTOP) for 2.5 s after it starts: the
    first node's MEET to it times out (node timeout 1 s) and is dropped."""

    def start(self, port):
        super().start(port)
        if port == self.ports[-1] and not hasattr(self, "resumed"):
            os.kill(self.processes[port].pid, signal.SIGSTOP)
            self.resumed = threading.Timer(2.5, os.kill, (self.processes[port].pid, signal.SIGCONT))
            self.resumed.start()


def test_a_node_that_missed_its_meet_is_met_again_and_the_cluster_forms(tmp_path):
    cluster = _LateNode(str(tmp_path / "cluster"), start_timeout_s=15.0)
    with cluster as url:
        client = redis.RedisCluster.from_url("redis://" + url.split(",")[0].split("//")[1])
        client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
        for port in cluster.ports:
            assert len(cluster.node(port).execute_command("CLUSTER", "NODES").splitlines()) == 6


def test_a_master_killed_with_9_loses_no_acknowledged_click(tmp_path):
    cluster = RedisCluster(str(tmp_path / "cluster"))
    with cluster as url:
        appender = ClickAppender(url)
        appender.start()
        time.sleep(1.0)
        master = cluster.master_of(appender.store._key(0))
        cluster.kill(master)
        time.sleep(4.0)  # (the node timeout is 1 s: its replica is the master by now)
        cluster.start(master)  # (back as the new master's replica, so that WAIT 1 is met again)
        cluster.wait_ok()
        time.sleep(2.0)
        appender.stop.set()
        appender.join(60)
        assert appender.error is None, appender.error
        assert appender.store.retried > 0  # it rode through the failover
        assert cluster.master_of(appender.store._key(0)) != master
        exactly_once(appender, url)
        assert len(appender.acknowledged) > 100


def test_an_unconfirmed_append_is_counted_and_the_same_lines_sent_again_apply_once(tmp_path):
    """Issue 68 (2), the repro: `--wait_replicas=2` on shards of one replica. The transaction
    runs on the master before WAIT falls short: the line counts those clicks as on the master,
    not confirmed (it said 0 appended while the user went from 20 to 30), and the same lines
    sent again (with --wait_replicas=1) leave the user at 30, not 40."""
    columns = ["--format=csv", "--columns=user=0,item=1,category=2,action=3,time=4", "--click=pv"]
    first, second = tmp_path / "cl_a0.csv", tmp_path / "cl_a1.csv"
    first.write_text("".join(f"7,{100 + i},3,pv,{1_600_000_000 + i}\n" for i in range(20)))
    second.write_text("".join(f"7,{200 + i},3,pv,{1_600_001_000 + i}\n" for i in range(10)))
    with RedisCluster(str(tmp_path / "cluster")) as url:
        def append(path, wait):
            return run_program("serving.histories", "append", f"--store={url}", f"--input={path}",
                               f"--wait_replicas={wait}", "--retry_s=2", *columns)

        def held():
            return len(json.loads(program("show", f"--store={url}", "--user_id=7"))["items"])

        assert append(first, 1).returncode == 0 and held() == 20
        done = append(second, 2)
        assert done.returncode == 1
        line = done.stderr.strip()
        assert "\n" not in line and line.startswith(f"error: {url}: user 7's append reached 1 replicas of its "
                                                     "master, not --wait_replicas=2, within 2 s"), line
        assert line.endswith(f"(0 of the batch's 1 users appended before it; user 7's 10 clicks are on its master, "
                             f"not confirmed); 0 of the 10 clicks of {second} were appended before it and 10 more are "
                             "on their masters, not confirmed, each user's whole or not at all; sending the same "
                             "lines again appends each user's clicks once"), line
        assert held() == 30
        again = append(second, 1)
        assert again.returncode == 0, again.stderr[-2000:]
        assert held() == 30  # (applied once)


def test_string_codes_are_confirmed_before_a_click_uses_them_and_a_lost_one_is_one_line(tmp_path):
    """Issue 68 (1): with string ids the codes of new strings (the `{meta}` tables) were written
    with no WAIT, so an acknowledged append could hold codes a failover loses, and a lost code
    read back as a traceback. New codes are now confirmed by `--wait_replicas` replicas before
    any click uses them (here 2 of 1: refused at the first codes it waits on, the user's
    history untouched), and a code that
    names no string is one line naming the store."""
    columns = ["--format=csv", "--columns=user=0,item=1,category=2,action=3,time=4", "--click=pv", "--string_ids"]
    first, second = tmp_path / "s0.csv", tmp_path / "s1.csv"
    first.write_text("mu2,base-item,c0,pv,2020-01-01T00:00:00Z\n")
    second.write_text("".join(f"mu2,NEW-mu2-{i},c0,pv,2020-01-01T00:00:0{i + 1}Z\n" for i in range(3)))
    with RedisCluster(str(tmp_path / "cluster")) as url:
        def append(path, wait):
            return run_program("serving.histories", "append", f"--store={url}", f"--input={path}",
                               f"--wait_replicas={wait}", "--retry_s=2", *columns)

        assert append(first, 1).returncode == 0
        done = append(second, 2)
        assert done.returncode == 1 and done.stderr.strip() == (
            f"error: {url}: the codes of 1 strings already written reached 1 replicas of its master, not "
            "--wait_replicas=2, within 2 s"), done.stderr[-2000:]
        assert json.loads(program("show", f"--store={url}", "--user_id=mu2"))["items"] == ["base-item"]
        assert append(second, 1).returncode == 0
        assert json.loads(program("show", f"--store={url}", "--user_id=mu2"))["items"] == [
            "base-item", "NEW-mu2-0", "NEW-mu2-1", "NEW-mu2-2"]
        client = redis.RedisCluster(startup_nodes=startup_nodes(url))
        names = "dare:histories:{meta}:names"
        lost = next(code for code, text in client.hgetall(names).items() if text == b"NEW-mu2-1")
        client.hdel(names, lost)  # (as a failover that lost it would leave the store)
        shown = run_program("serving.histories", "show", f"--store={url}", "--user_id=mu2")
        assert shown.returncode == 1 and shown.stderr.strip() == (
            f"error: {url}: the store holds clicks with codes [{int(lost)}] that name no string (its {names} lacks "
            "them: lost in a failover?); load the store again"), shown.stderr[-2000:]


def test_a_code_another_appender_wrote_unconfirmed_is_confirmed_before_a_click_uses_it(tmp_path):
    """Issue 68 (1), the case left open: appender A has written a new string's code on the
    `{meta}` master and its WAIT has not returned (here: never will, the master's replica is
    down); appender B read that code and appended with it, acknowledged, though a failover
    of `{meta}` would lose the code. B now confirms the codes it has not seen confirmed:
    refused in one line, the user's history untouched; the codes it confirmed before are
    not waited on again."""
    cluster = RedisCluster(str(tmp_path / "cluster"))
    with cluster as url:
        store = open_store(url, string_ids=True, cluster={"wait_replicas": 1, "retry_s": 2})
        users = [f"u{k}" for k in range(6)]
        for user in users:
            store.append(user, ["base-item"], ["c0"], [0])
        meta = cluster.master_of("dare:histories:{meta}:ids")
        user = next(u for u in users if cluster.master_of(store._key(int(store.codes("users", [u])[0]))) != meta)
        replica = next(p for p in cluster.running() if cluster.node(p).info("replication").get("master_port") == meta)
        cluster.kill(replica)
        assert store.append(user, ["base-item"], ["c0"], [1]) == 2  # (codes it confirmed: no WAIT on {meta})
        node = cluster.node(meta)  # appender A: the code of a new string, on the master only
        fresh = node.incr("dare:histories:{meta}:next_id")
        node.hset("dare:histories:{meta}:names", fresh, "A-item")
        node.hsetnx("dare:histories:{meta}:ids", "A-item", fresh)
        with pytest.raises(StoreError) as refused:
            store.append(user, ["A-item"], ["c0"], [2])
        assert str(refused.value) == (f"{url}: the codes of 1 strings already written reached 0 replicas of its "
                                      "master, not --wait_replicas=1, within 2 s")
        assert store.last([user]).lengths.tolist() == [2]
        store.close()


def test_a_replica_killed_ends_an_append_waiting_for_it_in_one_line(tmp_path):
    cluster = RedisCluster(str(tmp_path / "cluster"))
    with cluster as url:
        appender = ClickAppender(url, retry_s=2.0)
        appender.start()
        time.sleep(0.5)
        replica = next(p for p in cluster.ports[3:] if p in cluster.running())
        cluster.kill(replica)
        appender.join(60)
        assert appender.error is not None and "\n" not in appender.error
        assert " replicas of its master, not --wait_replicas=1, within 2 s (" in appender.error, appender.error
        assert re.search(r"users appended before it; user \d+'s 1 clicks are on its master, not confirmed\)$",
                         appender.error), appender.error
        exactly_once(appender, url)


def test_the_whole_cluster_killed_and_started_again_keeps_every_acknowledged_click(tmp_path):
    cluster = RedisCluster(str(tmp_path / "cluster"))
    with cluster as url:
        appender = ClickAppender(url, wait_replicas=0)
        appender.start()
        time.sleep(1.0)
        appender.stop.set()
        appender.join(60)
        for port in cluster.ports:
            cluster.kill(port)
        for port in cluster.ports:
            cluster.start(port)
        cluster.wait_ok()
        exactly_once(appender, url)
        assert len(appender.acknowledged) > 50
