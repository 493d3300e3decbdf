"""The index's shard_placements key (docs/format.md 3.3): written only when given, validated
when read (a reader never trusts a file), ignored where absent."""
import json

import pytest

from smdebug.exceptions import IndexReaderException
from smdebug.storage.format.index import PLACEMENTS_KEY, index_json_from_items, parse_index_json


def index_with(placements):
    return index_json_from_items("TRAIN", 0, "events/000000000000/000000000000_worker_0.tfevents", [], [],
                                 placements)


def test_absent_unless_given_and_round_trips():
    assert PLACEMENTS_KEY not in json.loads(index_with(None))
    block = {"global_shape": [3, 5], "local_shape": [1, 5], "offsets": [2, 0]}
    flat = {"global_shape": [3, 5], "local_shape": [4], "flat_offset": 11}
    parsed = parse_index_json(index_with({"w": block, "v": flat}), "x.json").placements
    assert parsed["w"].offsets == (2, 0) and parsed["w"].local_shape == (1, 5) and not parsed["w"].flat
    assert parsed["v"].offsets == (11,) and parsed["v"].flat


@pytest.mark.parametrize("bad", [
    [1, 2],
    {"w": "no"},
    {"w": {"global_shape": [3, 5], "local_shape": [2, 5], "offsets": [2, 0]}},  # past the end
    {"w": {"global_shape": [3, 5], "local_shape": [1, 5], "offsets": [0]}},  # rank mismatch
    {"w": {"global_shape": [3, 5], "local_shape": [4], "flat_offset": 12}},  # 16 > 15 elements
    {"w": {"global_shape": [-1], "local_shape": [1], "offsets": [0]}},
    {"w": {"global_shape": [1] * 65, "local_shape": [1] * 65, "offsets": [0] * 65}},
])
def test_bad_placements_are_an_error_naming_the_file(bad):
    document = json.loads(index_with(None))
    document[PLACEMENTS_KEY] = bad
    with pytest.raises(IndexReaderException, match="x.json"):
        parse_index_json(json.dumps(document).encode(), "x.json")
