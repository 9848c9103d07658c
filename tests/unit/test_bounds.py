"""protocols/bounds.py: the JSON depth check counts only structure outside strings, and the tensor
count limit names what it counts."""

import json

import pytest

from lumenrt.protocols.bounds import MAX_TENSORS, check_json_depth, check_tensor_count
from lumenrt.protocols.errors import ServerError


@pytest.mark.parametrize(
    ("doc", "depth"),
    [
        ([1, 2, 3], 1),
        ({"a": [[1], [2]]}, 3),
        ({"inputs": [{"data": [[[[0.5]]]]}]}, 7),
        ({"s": "[[[[[[[[[[{{{{{{{{"}, 1),  # brackets inside a string are text
        ({"s": 'a \\" [[[[[[[[[[ \\\\'}, 1),  # escaped quotes do not end the string
    ],
)
def test_depth_is_measured_outside_strings(doc: object, depth: int) -> None:
    body = json.dumps(doc).encode()
    check_json_depth(body, depth)
    if depth > 1:
        with pytest.raises(ServerError, match=f"deeper than the limit of {depth - 1} levels"):
            check_json_depth(body, depth - 1)


def test_a_deep_body_is_refused_without_parsing_it() -> None:
    with pytest.raises(ServerError) as refused:
        check_json_depth(b"[" * 1_000_000 + b"]" * 1_000_000, 64)
    assert refused.value.status == 400 and "64 levels" in refused.value.message


def test_many_shallow_brackets_pass() -> None:
    check_json_depth(json.dumps([[i] for i in range(10_000)]).encode(), 2)


def test_tensor_count() -> None:
    check_tensor_count(MAX_TENSORS, "inputs")
    with pytest.raises(ServerError, match=f"outputs has {MAX_TENSORS + 1} tensors"):
        check_tensor_count(MAX_TENSORS + 1, "outputs")
