"""``compact_json`` writes the same bytes as ``json.dumps`` with compact separators."""

import json
import math

import pytest

from lumenrt.protocols.compact_json import compact_json


@pytest.mark.parametrize(
    "doc",
    [
        {
            "model_name": "m",
            "model_version": "1",
            "outputs": [{"name": "y", "shape": [1, 3], "data": [1.5, -2, 0]}],
        },
        {"error": 'model "ré" said \u2028 and \x00'},  # escapes and non-ASCII, as json.dumps does them
        {"parameters": {"lumenrt_queue_ns": 12345678901234, "flag": True, "none": None}},
        [math.inf, -math.inf, 1e-300, 2**70],
        "plain",
    ],
)
def test_the_same_bytes_as_json_dumps(doc: object) -> None:
    assert compact_json(doc) == json.dumps(doc, separators=(",", ":")).encode()


def test_what_json_cannot_say_raises_as_json_dumps_does() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact_json({"x": object()})
