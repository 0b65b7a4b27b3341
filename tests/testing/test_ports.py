"""The free ports servers in tests are started on: never one another process holds."""

import os
import subprocess
import sys
import time

import pytest

from dare_tf.testing import ports
from tests.conftest import REPO

DRAW = ("import random, sys; from dare_tf.testing.ports import free_port\n"
        "random.seed(0)\n"
        "print(*[free_port() for _ in range(8)])")


def test_two_processes_with_the_same_random_seed_get_different_ports():
    """The CI failure: two pytest workers had both set `random`'s seed (keras.utils.set_random_seed(0))
    and drew the same 'free' port for their guide walkthroughs' servers minutes before binding it; one
    walkthrough's client then asked the other's server."""
    drawn = [subprocess.run([sys.executable, "-c", DRAW], cwd=REPO, capture_output=True, text=True, check=True,
                            env=dict(os.environ, PYTHONPATH=REPO)).stdout.split() for _ in range(2)]
    assert len(drawn[0]) == len(drawn[1]) == 8 and not set(drawn[0]) & set(drawn[1]), drawn
    low = ports.ephemeral_low()
    assert all(ports.LOWEST <= int(p) < low for p in drawn[0] + drawn[1]), (drawn, low)


def test_a_reserved_port_is_not_handed_out_again_until_its_time_runs_out(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "reservations", lambda: str(tmp_path))
    held = range(20000, 20005)
    assert [ports._reserve(p) for p in held] == [True] * 5
    assert [ports._reserve(p) for p in held] == [False] * 5  # held: no other caller gets them
    old = time.time() - ports.RESERVE_S - 1
    os.utime(tmp_path / "20000", (old, old))
    assert ports._reserve(20000) and not ports._reserve(20000)  # stale: taken over, once
    assert sorted(os.listdir(tmp_path)) == [str(p) for p in held]  # (the stale file's rename removed)


def test_a_port_handed_out_is_reserved_and_bindable(monkeypatch, tmp_path):
    import socket

    monkeypatch.setattr(ports, "reservations", lambda: str(tmp_path))
    drawn = [ports.free_port() for _ in range(20)]
    assert len(set(drawn)) == 20 and sorted(os.listdir(tmp_path)) == sorted(map(str, drawn))
    with socket.socket() as s:
        s.bind(("127.0.0.1", drawn[0]))


def test_a_port_and_its_bus_port_are_free_and_clear_of_the_taken_ones():
    taken: set[int] = set()
    for _ in range(6):
        port = ports.free_port(taken, bus_offset=10000)
        assert port + 10000 < ports.ephemeral_low()
        assert not {port, port + 10000} & (taken | {t + 10000 for t in taken} | {t - 10000 for t in taken})
        taken.add(port)


def test_too_few_ports_below_the_ephemeral_range_is_said(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 10500)
    with pytest.raises(RuntimeError) as e:
        ports.free_port()
    assert str(e.value) == "too few ports below the ephemeral range (10500) from 10000"
