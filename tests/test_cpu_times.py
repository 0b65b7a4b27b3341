"""tests/cpu_times.py: the slow list and the order the suite's workers take the tests in."""

import pytest

from tests.cpu_times import longest_first, slow_ids


class Item:
    """What `longest_first` reads of a pytest item: its node id and its marks."""

    def __init__(self, nodeid, group=None, slow=False):
        self.nodeid = f"{nodeid}@{group}" if group else nodeid  # (as pytest-xdist's loadgroup names it)
        self.marks = {"xdist_group": pytest.mark.xdist_group(group).mark} if group else {}
        if slow:
            self.marks["slow"] = pytest.mark.slow.mark

    def get_closest_marker(self, name):
        return self.marks.get(name)


def test_the_work_units_go_longest_first_a_group_by_its_tests_sum():
    items = [Item("t.py::fast_a"), Item("t.py::one_long"), Item("g.py::first", "g"), Item("t.py::fast_b"),
             Item("t.py::marked_unmeasured", slow=True), Item("t.py::medium"), Item("g.py::second", "g"),
             Item("h.py::only", "h")]
    costs = {"t.py::one_long": 50.0, "g.py::first": 30.0, "g.py::second": 25.0, "t.py::medium": 9.0}
    longest_first(items, costs)
    assert [i.nodeid for i in items] == [
        "g.py::first@g", "g.py::second@g",  # 55 CPU s in all: before the longest single test
        "t.py::one_long", "t.py::medium",
        "t.py::marked_unmeasured", "h.py::only@h",  # slow or grouped, unmeasured: in their order
        "t.py::fast_a", "t.py::fast_b"]


def test_the_list_keeps_a_listed_test_down_to_half_the_threshold_and_whole_groups():
    records = [{"id": "a", "cpu": 2.5, "group": None}, {"id": "b", "cpu": 1.2, "group": None},
               {"id": "c", "cpu": 1.2, "group": None}, {"id": "d", "cpu": 0.9, "group": None},
               {"id": "e", "cpu": 3.0, "group": "g"}, {"id": "f", "cpu": 0.1, "group": "g"}]
    assert slow_ids(records, 2.0, before={"b", "d"}) == {"a": 2.5, "b": 1.2, "e": 3.0, "f": 0.1}
