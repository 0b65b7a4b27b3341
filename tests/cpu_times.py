"""The CPU each test costs, and the list of the slow ones (`tests/slow.txt`).

`make slow-list` runs the suite with this module as a pytest plugin
(`-p tests.cpu_times`): each test's CPU seconds (its process's and its
children's, setup and teardown included: a module fixture counts in its first
test) are appended to `CPU_TIMES` (default `.cpu_times.jsonl`). Then
`python -m tests.cpu_times` writes `tests/slow.txt`: every test that took
`THRESHOLD_S` or more, and every test of an `xdist_group` any of whose tests is
listed (their shared fixture would move to the next), one node id a line.
`tests/conftest.py` marks the tests listed `slow`: `make check` (`-m "not
slow"`) leaves them out. Measured in CPU seconds, not wall time: the same on a
loaded machine."""

from __future__ import annotations

import json
import os
import resource
import sys
from collections import defaultdict

import pytest

THRESHOLD_S = 2.0
HERE = os.path.dirname(os.path.abspath(__file__))
LIST = os.path.join(HERE, "slow.txt")


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = _cpu()
    yield
    group = item.get_closest_marker("xdist_group")
    record = {"id": item.nodeid.split("@")[0], "cpu": round(_cpu() - started, 3),
              "group": group.args[0] if group and group.args else None,
              "marked": item.get_closest_marker("slow") is not None and item.nodeid not in listed()}
    with open(os.environ.get("CPU_TIMES", ".cpu_times.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def listed() -> set[str]:
    """The node ids `tests/slow.txt` lists."""
    if not os.path.exists(LIST):
        return set()
    with open(LIST) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def slow_ids(records: list[dict], threshold: float = THRESHOLD_S) -> list[str]:
    """The tests to list: over `threshold` CPU seconds (not marked `slow` in their code
    already), with every test of their groups."""
    slow = {r["id"] for r in records if r["cpu"] >= threshold and not r["marked"]}
    groups = defaultdict(set)
    for r in records:
        if r["group"]:
            groups[r["group"]].add(r["id"])
    for members in groups.values():
        if members & slow:
            slow |= members
    marked = {r["id"] for r in records if r["marked"]}
    return sorted(slow - marked)


def main(path: str) -> None:
    with open(path) as f:
        records = [json.loads(line) for line in f]
    ids = slow_ids(records)
    with open(LIST, "w") as f:
        f.write(f"# Tests measured at {THRESHOLD_S} CPU seconds or more (or sharing a group's fixture with one),\n"
                "# marked slow by tests/conftest.py; written by `make slow-list` (tests/cpu_times.py).\n")
        f.writelines(i + "\n" for i in ids)
    fast = [r["cpu"] for r in records if r["id"] not in ids and not r["marked"]]
    print(f"{LIST}: {len(ids)} tests; the tests not slow ({len(fast)}) took {sum(fast):.0f} CPU seconds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".cpu_times.jsonl")
