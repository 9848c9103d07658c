"""The request payload: made from the model's metadata, or read from a file.

From metadata (KServe V2 ``inputs``: name, datatype, shape): a variable dimension (-1) becomes
``batch`` when it is the first and the model batches (``max_batch_size`` > 0 in its config), else
1. Values are deterministic (seeded): normal floats, small integers, ``b"lumenrt"`` for BYTES.

From a file: ``.npy`` holds the one input of a one-input model (its name from the metadata, else
``input``); ``.npz`` holds one array per input name. When metadata is at hand, the names must
match it.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lumenrt.protocols import dtypes

_SEED = 20261121


def inputs_from_metadata(
    metadata: Mapping[str, Any], config: Mapping[str, Any] | None, batch: int = 1
) -> dict[str, npt.NDArray[Any]]:
    """One deterministic array per input the metadata lists; ValueError naming a field it cannot use."""
    specs = metadata.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise ValueError("the model metadata lists no 'inputs'; give --input-file")
    batches = bool(config and int(config.get("max_batch_size", 0) or 0) > 0)
    rng = np.random.default_rng(_SEED)
    out: dict[str, npt.NDArray[Any]] = {}
    for i, spec in enumerate(specs):
        name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise ValueError(f"model metadata inputs[{i}]: needs 'name', 'datatype' and 'shape'")
        dims = [int(d) for d in shape]
        if dims and dims[0] < 0 and batches:
            dims[0] = batch
        dims = [1 if d < 0 else d for d in dims]
        out[name] = _values(rng, datatype, tuple(dims), f"inputs[{i}] {name!r}")
    return out


def _values(rng: np.random.Generator, datatype: str, shape: tuple[int, ...], where: str) -> npt.NDArray[Any]:
    if datatype == "BYTES":
        return np.full(shape, b"lumenrt", dtype=np.object_)
    if not dtypes.is_valid(datatype):
        raise ValueError(f"model metadata {where}: unknown datatype {datatype!r}")
    dtype = dtypes.to_numpy(datatype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 10, shape).astype(dtype)


def inputs_from_file(path: str | Path, metadata: Mapping[str, Any] | None) -> dict[str, npt.NDArray[Any]]:
    """The arrays in ``path`` (.npy or .npz) keyed by input name; ValueError naming the problem."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--input-file {str(p)!r}: no such file")
    names = [str(s.get("name")) for s in metadata.get("inputs", [])] if metadata else []
    if p.suffix == ".npy":
        array = np.load(p, allow_pickle=False)
        if len(names) > 1:
            raise ValueError(
                f"--input-file {str(p)!r}: a .npy holds one input; the model takes {names} (use .npz)"
            )
        return {names[0] if names else "input": array}
    if p.suffix == ".npz":
        with np.load(p, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        if not arrays:
            raise ValueError(f"--input-file {str(p)!r}: the .npz holds no arrays")
        if names and sorted(arrays) != sorted(names):
            raise ValueError(
                f"--input-file {str(p)!r}: holds {sorted(arrays)}, the model takes {sorted(names)}"
            )
        return arrays
    raise ValueError(f"--input-file {str(p)!r}: use .npy (one input) or .npz (one array per input name)")


def payload_bytes(inputs: Mapping[str, npt.NDArray[Any]]) -> int:
    """The inputs' raw size in bytes (BYTES elements counted with their 4-byte length prefix)."""
    total = 0
    for array in inputs.values():
        if array.dtype == np.object_:
            total += sum(4 + len(bytes(x)) for x in array.reshape(-1))
        else:
            total += int(array.nbytes)
    return total
