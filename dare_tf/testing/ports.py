"""Free localhost ports for the servers tests and benchmarks start: one owner.

A port found free now is bound by a server seconds or minutes later (a guide's
walkthrough trains first). Two things can take it meanwhile, and both happened
in CI: another test process choosing the same port (the `random` module's state
is the same in two pytest workers that both ran `keras.utils.set_random_seed(0)`),
and the kernel handing it out for an outgoing connection. So the port is drawn
from the operating system's randomness below the kernel's ephemeral range, and
reserved across processes for `RESERVE_S` by a file of this module's own
directory created exclusively (`O_EXCL`), before it is returned.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time

RESERVE_S = 3600.0  # how long a port handed out stays another caller's (a walkthrough runs up to 15 minutes)
LOWEST = 10000
_DRAW = random.SystemRandom()  # (no seed a test sets reaches it)


def ephemeral_low() -> int:
    """The first port the kernel hands out for port 0 (32768 where it does not say)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def reservations() -> str:
    """The directory of reservation files, one per user (made on first use)."""
    path = os.path.join(tempfile.gettempdir(), f"dare_tf-ports-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    return path


def _reserve(port: int) -> bool:
    """Whether this caller now holds `port` (no other holds it, or its holder's time ran out)."""
    path = os.path.join(reservations(), str(port))
    try:
        if time.time() - os.stat(path).st_mtime > RESERVE_S:  # stale: taken over by whoever renames it first
            os.rename(path, f"{path}.stale-{os.getpid()}-{_DRAW.getrandbits(32)}")
    except OSError:
        pass
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    for name in os.listdir(reservations()):  # (the renamed stale ones: ours to remove)
        if name.startswith(f"{port}.stale-"):
            try:
                os.remove(os.path.join(reservations(), name))
            except OSError:
                pass
    return True


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(taken: set[int] | frozenset[int] = frozenset(), bus_offset: int | None = None) -> int:
    """A localhost port free now, below the ephemeral range, reserved for the caller
    for RESERVE_S. `bus_offset`: the port that much higher must be free too and no
    port of `taken` may be either one's other half (redis-server's cluster bus is
    10,000 above its port)."""
    high = ephemeral_low() - (bus_offset or 0)
    if high - LOWEST < 1000:
        raise RuntimeError(f"too few ports below the ephemeral range ({ephemeral_low()}) from {LOWEST}")
    near = set(taken) | ({t + bus_offset for t in taken} | {t - bus_offset for t in taken} if bus_offset else set())
    for _ in range(1000):
        port = _DRAW.randrange(LOWEST, high)
        pair = {port, port + bus_offset} if bus_offset else {port}
        if pair & near or not all(map(_bindable, pair)) or not all(map(_reserve, pair)):
            continue
        return port
    raise RuntimeError(f"no free port found in 1,000 draws from {LOWEST} to {high}")
