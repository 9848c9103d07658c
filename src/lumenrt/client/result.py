"""What every client returns for one inference."""

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt


@dataclass(slots=True)
class InferResult:
    """``outputs``: output name -> array. Over TCP the arrays are read-only views of the received
    bytes (copy one to change it). ``timing``: the server's stage times when asked for
    (``queue_ns``, ``batch_ns``, ``compute_ns``, ``return_ns``, ``engine_ns``, ``batch_size``),
    else empty."""

    model: str
    version: str
    outputs: dict[str, npt.NDArray[Any]]
    timing: dict[str, int] = field(default_factory=dict)
    request_id: int = 0
