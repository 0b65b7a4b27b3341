"""dare_tf.data.storage.id_maps: an id map's lines come back as they were written, whatever
text a string id holds (spaces, `&`, quotes, commas, non-ASCII, and characters that Python's
`str.splitlines` would split at), and the digest tells id maps apart."""

import numpy as np

from dare_tf.data.logs.string_ids import OWN_PREFIX, id_problem
from dare_tf.data.preparation.prepared import write_lines
from dare_tf.data.storage.id_maps import id_map_digest, read_id_file, read_id_map
from dare_tf.data.storage.spec import ID_MAP_FILES

IDS = ["Pet Supplies", "Home & Garden", '"Quoted" Mug', "Cup, large", "Café crème", "  padded  ", "a\x85b",
       "a\u2028b", "~SKU 1", OWN_PREFIX + "SKU 1", "007", "7"]


def test_any_string_id_round_trips_through_an_id_map(tmp_path):
    # (NEL and U+2028 are no longer ids, issue 68 (9); an id map written before reads back as it was)
    line_breaks = {"a\x85b", "a\u2028b"}
    assert [id_problem(i) for i in IDS if not i.startswith(OWN_PREFIX) and i not in line_breaks] == [None] * (
        len(IDS) - 3)
    assert all(id_problem(i) for i in line_breaks)
    for kind, values in (("item", IDS), ("category", IDS[::-1]), ("user", ["u1"])):
        write_lines(str(tmp_path / ID_MAP_FILES[kind]), np.array(values, object))
    assert read_id_map(str(tmp_path), "item") == IDS  # (splitlines would cut "a\x85b" and "a\u2028b" in two)
    assert read_id_file(str(tmp_path / ID_MAP_FILES["category"])) == IDS[::-1]
    (tmp_path / "empty.txt").write_text("")
    assert read_id_file(str(tmp_path / "empty.txt")) == []
    before = id_map_digest(str(tmp_path))
    write_lines(str(tmp_path / ID_MAP_FILES["item"]), np.array(IDS[1:] + IDS[:1], object))
    assert id_map_digest(str(tmp_path)) != before
