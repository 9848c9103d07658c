"""Checking a request's inputs against the model config before anything is queued.

Every problem is an InvalidInput naming the input and what was expected; nothing is copied or
queued for a request that fails here.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from lumenrt.engine.config import ModelConfig, TensorSpec
from lumenrt.engine.request import Array, InvalidInput
from lumenrt.protocols.dtypes import to_numpy


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    return to_numpy(datatype)


def _check_shape(spec: TensorSpec, array: Array, batched: bool, model: str) -> None:
    expected = ((-1,) if batched else ()) + spec.dims
    if array.ndim != len(expected) or any(
        e != -1 and e != got for e, got in zip(expected, array.shape, strict=True)
    ):
        shown = (
            "[" + ", ".join("batch" if batched and i == 0 else str(d) for i, d in enumerate(expected)) + "]"
        )
        raise InvalidInput(
            f"model {model!r}: input {spec.name!r}: shape {list(array.shape)} does not match {shown}"
        )


def validate_inputs(config: ModelConfig, inputs: Mapping[str, Any]) -> tuple[dict[str, Array], int]:
    """Returns the inputs as arrays (no copy when already arrays of the right dtype) and the
    number of rows (the batch size; 1 for a model without a batch dimension)."""
    if not isinstance(inputs, Mapping):
        raise InvalidInput(f"model {config.name!r}: inputs must be a mapping of input name to array")
    known = {spec.name for spec in config.inputs}
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise InvalidInput(f"model {config.name!r}: unknown input {unknown[0]!r} (inputs: {sorted(known)})")
    batched = config.max_batch_size > 0
    arrays: dict[str, Array] = {}
    rows = -1
    for spec in config.inputs:
        if spec.name not in inputs:
            raise InvalidInput(f"model {config.name!r}: missing input {spec.name!r}")
        value = inputs[spec.name]
        want = numpy_dtype(spec.datatype)
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if array.dtype != want and not (spec.datatype == "BYTES" and array.dtype.kind in "OSU"):
            raise InvalidInput(
                f"model {config.name!r}: input {spec.name!r}: datatype {array.dtype} but the model takes "
                f"{spec.datatype} ({want})"
            )
        _check_shape(spec, array, batched, config.name)
        if batched:
            n = int(array.shape[0])
            if n < 1:
                raise InvalidInput(f"model {config.name!r}: input {spec.name!r}: empty batch")
            if n > config.max_batch_size:
                raise InvalidInput(
                    f"model {config.name!r}: input {spec.name!r}: batch of {n} exceeds max_batch_size "
                    f"{config.max_batch_size}"
                )
            if rows not in (-1, n):
                raise InvalidInput(
                    f"model {config.name!r}: input {spec.name!r}: batch of {n} but other inputs have {rows}"
                )
            rows = n
        arrays[spec.name] = array
    return arrays, max(rows, 1)
