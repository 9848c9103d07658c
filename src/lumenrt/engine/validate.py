"""Checking a request's inputs against the model config before anything is queued.

Every problem is an InvalidInput naming the input and what was expected; nothing is copied or
queued for a request that fails here.

``InputCheck`` is the same check with what the config fixes worked out once per model (names,
dtypes, dims): a request whose inputs are already a dict of arrays in the config's order (what
the front ends pass) costs a few comparisons and no new objects but the shapes numpy makes, and
its dict is returned as it is; anything else is handed to ``validate_inputs``, which converts, puts
the inputs in the config's order (the slot layout's), or names what is wrong.
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


class InputCheck:
    """``validate_inputs`` for one config, worked out once (see the top)."""

    __slots__ = ("_batched", "_config", "_max_rows", "_specs")

    def __init__(self, config: ModelConfig) -> None:
        self._config = config
        self._batched = config.max_batch_size > 0
        self._max_rows = config.max_batch_size
        # name, numpy dtype, non-batch dims (None when one is variable), rank, BYTES
        self._specs = tuple(
            (
                spec.name,
                numpy_dtype(spec.datatype),
                None if -1 in spec.dims else spec.dims,
                len(spec.dims) + (1 if self._batched else 0),
                spec.datatype == "BYTES",
            )
            for spec in config.inputs
        )

    def __call__(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Array], int]:
        """As ``validate_inputs(config, inputs)``."""
        if type(inputs) is not dict or len(inputs) != len(self._specs):
            return validate_inputs(self._config, inputs)
        rows = -1
        for (name, want, dims, rank, is_bytes), given in zip(self._specs, inputs, strict=True):
            array = inputs[given]
            if (
                given != name
                or type(array) is not np.ndarray
                or array.dtype != want
                or array.ndim != rank
                or is_bytes
            ):
                return validate_inputs(self._config, inputs)  # converts, or names what is wrong
            shape = array.shape
            if self._batched:
                n = shape[0]
                if dims is None or shape[1:] != dims or not 0 < n <= self._max_rows or rows not in (-1, n):
                    return validate_inputs(self._config, inputs)
                rows = n
            elif dims is None or shape != dims:
                return validate_inputs(self._config, inputs)
        return inputs, max(rows, 1)
