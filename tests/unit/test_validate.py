"""Input checks against the model config (engine/validate.py): ``InputCheck``, the per-model form
the runtime and the lane use, answers exactly as ``validate_inputs`` for every input, good or bad:
the same arrays in the config's order and rows, or the same error naming the field. One test body
over both."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from lumenrt.engine.config import ModelConfig, TensorSpec
from lumenrt.engine.request import InvalidInput
from lumenrt.engine.validate import InputCheck, validate_inputs

BATCHED = ModelConfig(
    name="two",
    backend="python",
    max_batch_size=4,
    inputs=(TensorSpec("a", "FP32", (3,)), TensorSpec("b", "INT64", (-1, 2))),
    outputs=(TensorSpec("y", "FP32", (1,)),),
)
PLAIN = ModelConfig(
    name="plain",
    backend="python",
    max_batch_size=0,
    inputs=(TensorSpec("x", "FP32", (2, 2)), TensorSpec("t", "BYTES", (1,))),
    outputs=(TensorSpec("y", "FP32", (1,)),),
)


def f32(*shape: int) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


def i64(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.int64)


CASES: list[tuple[ModelConfig, Any]] = [
    (BATCHED, {"a": f32(2, 3), "b": i64(2, 5, 2)}),  # good
    (BATCHED, {"b": i64(2, 5, 2), "a": f32(2, 3)}),  # good, out of the config's order
    (BATCHED, {"a": f32(1, 3).tolist(), "b": i64(1, 1, 2)}),  # a list: converted
    (BATCHED, {"a": f32(2, 3)}),  # missing
    (BATCHED, {"a": f32(2, 3), "b": i64(2, 5, 2), "c": f32(1)}),  # unknown
    (BATCHED, {"a": f32(2, 4), "b": i64(2, 5, 2)}),  # a dim
    (BATCHED, {"a": f32(2, 3), "b": i64(3, 5, 2)}),  # rows differ
    (BATCHED, {"a": f32(5, 3), "b": i64(5, 1, 2)}),  # over max_batch_size
    (BATCHED, {"a": f32(0, 3), "b": i64(0, 1, 2)}),  # empty batch
    (BATCHED, {"a": f32(2, 3).astype(np.float64), "b": i64(2, 5, 2)}),  # dtype
    (BATCHED, {"a": f32(3), "b": i64(2, 5, 2)}),  # rank
    (BATCHED, [("a", f32(1, 3))]),  # not a mapping
    (PLAIN, {"x": f32(2, 2), "t": np.array([b"hi"], dtype=object)}),  # good, BYTES
    (PLAIN, {"x": f32(2, 3), "t": np.array([b"hi"], dtype=object)}),  # a dim
]


def outcome(check: Callable[[Any], tuple[dict[str, Any], int]], inputs: Any) -> Any:
    try:
        arrays, rows = check(inputs)
    except InvalidInput as e:
        return ("error", str(e))
    return (
        "ok",
        [(k, v.dtype, v.shape, v.tobytes() if v.dtype != object else list(v)) for k, v in arrays.items()],
        rows,
    )


@pytest.mark.parametrize("index", range(len(CASES)))
def test_input_check_answers_as_validate_inputs(index: int) -> None:
    config, inputs = CASES[index]
    assert outcome(InputCheck(config), inputs) == outcome(lambda i: validate_inputs(config, i), inputs)


def test_a_dict_of_arrays_in_order_is_passed_on_as_it_is() -> None:
    """Fixed dims (a variable one takes ``validate_inputs``' way, checked above)."""
    config = ModelConfig(
        name="fixed",
        backend="python",
        max_batch_size=4,
        inputs=(TensorSpec("a", "FP32", (3,)), TensorSpec("b", "INT64", (5, 2))),
        outputs=(TensorSpec("y", "FP32", (1,)),),
    )
    inputs = {"a": f32(2, 3), "b": i64(2, 5, 2)}
    arrays, rows = InputCheck(config)(inputs)
    assert arrays is inputs and rows == 2
    reordered, _ = InputCheck(config)({"b": inputs["b"], "a": inputs["a"]})
    assert reordered is not inputs and list(reordered) == ["a", "b"]  # the slot layout's order
