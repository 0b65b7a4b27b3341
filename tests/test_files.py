"""dare_tf._files: the one output-directory guard, its one contract and its messages."""

import os

import pytest

from dare_tf._files import OutputDirError, guard_output_dir

OWN = {"report.md", "figures"}.__contains__


def test_absent_empty_or_wholly_claimed_directories_pass(tmp_path):
    guard_output_dir(str(tmp_path / "new"), OWN, "the suite")
    guard_output_dir(str(tmp_path), OWN, "the suite")
    (tmp_path / "report.md").write_text("x")
    (tmp_path / "figures").mkdir()
    guard_output_dir(str(tmp_path), OWN, "the suite")


def test_refusals_name_the_path_the_entries_and_the_writer(tmp_path):
    real = os.path.realpath(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputDirError, match=f"^--output_dir={real}/afile exists and is not a directory; "
                                             "remove it or choose another path$"):
        guard_output_dir(str(tmp_path / "afile"), OWN, "the suite")
    (tmp_path / "report.md").write_text("x")
    for i in range(6):
        (tmp_path / f"note{i}.txt").write_text("x")
    with pytest.raises(OutputDirError, match=rf"^--output_dir={real} holds files the suite did not write: "
                                             r"'afile', 'note0.txt', 'note1.txt', 'note2.txt', 'note3.txt' and 2 "
                                             r"more\. Refusing to change it: move them away or choose another "
                                             r"directory$"):
        guard_output_dir(str(tmp_path), OWN, "the suite")
    with pytest.raises(OutputDirError, match=rf"^--output_dir={real} contains the input log {real}/afile; "
                                             "choose a directory of its own for the output of the suite$"):
        guard_output_dir(str(tmp_path), OWN, "the suite", {"the input log": str(tmp_path / "afile")})


def test_a_directory_of_which_nothing_is_claimed_is_named_for_what_it_is_not(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(OutputDirError, match=r"is not empty and is not a dataset; it holds 'notes.txt'\. "
                                             r"Refusing to replace it: choose an empty or new directory$"):
        guard_output_dir(str(tmp_path), OWN, "preparation", unclaimed="a dataset")
    # Without `unclaimed`, the same refusal as any foreign entry.
    with pytest.raises(OutputDirError, match="holds files preparation did not write: 'notes.txt'"):
        guard_output_dir(str(tmp_path), OWN, "preparation")
