"""The CPU each test costs, the list of the slow ones (`tests/slow.txt`), and the
order the suite's workers take the tests in.

`make slow-list` runs the suite with this module as a pytest plugin
(`-p tests.cpu_times`): each test's CPU seconds (its process's and its
children's, setup and teardown included: a module fixture counts in its first
test) are appended to `CPU_TIMES` (default `.cpu_times.jsonl`). Then
`python -m tests.cpu_times` writes `tests/slow.txt`: every test that took
`THRESHOLD_S` or more (half of it if listed before), and every test of an `xdist_group` any of whose tests is
listed (their shared fixture would move to the next), one a line: the node id, a
tab, its CPU seconds. `tests/conftest.py` marks the tests listed `slow` (`make
check`, `-m "not slow"`, leaves them out) and hands them to the xdist workers
longest first (`longest_first`). Measured in CPU seconds, not wall time: the
same on a loaded machine."""

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
    node = item.nodeid.split("@")[0]  # (less the group pytest-xdist appends)
    record = {"id": node, "cpu": round(_cpu() - started, 3), "group": group_of(item),
              "marked": item.get_closest_marker("slow") is not None and node not in listed()}
    with open(os.environ.get("CPU_TIMES", ".cpu_times.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def listed() -> dict[str, float]:
    """The node ids `tests/slow.txt` lists, with their CPU seconds."""
    if not os.path.exists(LIST):
        return {}
    with open(LIST) as f:
        rows = [line.rstrip("\n").rsplit("\t", 1) for line in f if line.strip() and not line.startswith("#")]
    return {row[0]: float(row[1]) if len(row) == 2 else 0.0 for row in rows}


def slow_ids(records: list[dict], threshold: float = THRESHOLD_S, before=()) -> dict[str, float]:
    """The tests to list, with their CPU seconds: `threshold` or more (those marked `slow`
    in their code too: their cost orders the run), or half of it where `before` (the list
    until now) has them (a loaded machine's noise moves no test in and out of `make check`
    from one list to the next), with every test of their groups."""
    cpu = {r["id"]: r["cpu"] for r in records}
    slow = {r["id"] for r in records if r["cpu"] >= threshold or (r["id"] in before and r["cpu"] >= threshold / 2)}
    groups = defaultdict(set)
    for r in records:
        if r["group"]:
            groups[r["group"]].add(r["id"])
    for members in groups.values():
        if members & slow:
            slow |= members
    return {i: cpu[i] for i in sorted(slow)}


def group_of(item) -> str | None:
    """The name of the item's `xdist_group` (the tests `--dist loadgroup` sends to one worker)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return mark.args[0] if mark.args else mark.kwargs.get("name")


def longest_first(items: list, costs: dict[str, float]) -> None:
    """Sorts `items` (in place) as the xdist workers should take them: the work units
    (a group's tests together, any other test alone) by their CPU seconds in `costs`
    (a group's: its tests' sum), the longest first, then those marked `slow` without a
    measure, then the rest in their order. A worker takes the next unit when it is
    done, so the longest start at once and the short ones fill the end, not one long
    test left running alone (`pytest_configure` keeps xdist from reordering them)."""
    units: dict[str, float] = defaultdict(float)
    key = {}
    for item in items:
        group = group_of(item)
        unit = f"@{group}" if group else item.nodeid
        units[unit] += costs.get(item.nodeid.split("@")[0], 0.0)
        key[item.nodeid] = (unit, group is not None or item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (-units[key[item.nodeid][0]], not key[item.nodeid][1]))


def main(path: str) -> None:
    with open(path) as f:
        records = [json.loads(line) for line in f]
    slow = slow_ids(records, before=listed())
    with open(LIST, "w") as f:
        f.write(f"# Tests measured at {THRESHOLD_S} CPU seconds or more (or sharing a group's fixture with one),\n"
                "# with their CPU seconds: marked slow and run longest first by tests/conftest.py; written by\n"
                "# `make slow-list` (tests/cpu_times.py).\n")
        f.writelines(f"{i}\t{cpu:.1f}\n" for i, cpu in slow.items())
    fast = [r["cpu"] for r in records if r["id"] not in slow and not r["marked"]]
    print(f"{LIST}: {len(slow)} tests; the tests not slow ({len(fast)}) took {sum(fast):.0f} CPU seconds")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".cpu_times.jsonl")
