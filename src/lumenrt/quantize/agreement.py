"""FP32 against INT8 on held-out samples: how often the top class is the same, how far the scores
move, and, where the samples have labels, both models' accuracy.

The compared output is the model's scores: ``--output``, else the first floating-point output with
a class axis (rank >= 2, more than one value per sample), else the first floating-point output.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lumenrt.quantize.calibration import Samples
from lumenrt.quantize.errors import UsageError


@dataclass(frozen=True, slots=True)
class Agreement:
    source: str
    samples: int
    output: str
    top1_agreement: float | None  # None: the output has one value per sample (no classes)
    max_abs_error: float
    mean_abs_error: float
    accuracy_fp32: float | None  # None: no labels
    accuracy_int8: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "held_out": self.source,
            "samples": self.samples,
            "output": self.output,
            "top1_agreement": _round(self.top1_agreement),
            "max_abs_error": _round(self.max_abs_error),
            "mean_abs_error": _round(self.mean_abs_error),
            "accuracy": None
            if self.accuracy_fp32 is None
            else {"fp32": _round(self.accuracy_fp32), "int8": _round(self.accuracy_int8)},
        }


def score_output(outputs: Sequence[Any], requested: str | None) -> str:
    """The output to compare, from a session's ``get_outputs()`` (name, type, shape)."""
    names = [o.name for o in outputs]
    if requested is not None:
        if requested not in names:
            raise UsageError(
                f"--output {requested}: the model has no such output (it has {', '.join(names)})"
            )
        return requested
    floats = [o for o in outputs if o.type in ("tensor(float)", "tensor(double)", "tensor(float16)")]
    for o in floats:
        shape = list(o.shape or [])
        if len(shape) >= 2 and shape[-1] != 1:
            return str(o.name)
    if floats:
        return str(floats[0].name)
    raise UsageError(
        f"--output: the model has no floating-point output to compare (it has {', '.join(names)})"
    )


def compare(fp32: Any, int8: Any, held_out: Samples, output: str, batch: int) -> Agreement:
    """Run both sessions on ``held_out``, ``batch`` samples a run, and compare ``output``."""
    a_parts, b_parts = [], []
    for feed in held_out.batches(batch):
        a_parts.append(np.asarray(fp32.run([output], feed)[0]))
        b_parts.append(np.asarray(int8.run([output], feed)[0]))
    a = np.concatenate(a_parts).reshape(held_out.count, -1).astype(np.float64)
    b = np.concatenate(b_parts).reshape(held_out.count, -1).astype(np.float64)
    error = np.abs(a - b)
    top1 = accuracy_fp32 = accuracy_int8 = None
    if a.shape[1] > 1:
        top_a, top_b = a.argmax(axis=1), b.argmax(axis=1)
        top1 = _share(top_a == top_b)
        if held_out.labels is not None:
            accuracy_fp32, accuracy_int8 = _share(top_a == held_out.labels), _share(top_b == held_out.labels)
    return Agreement(
        source=held_out.source,
        samples=held_out.count,
        output=output,
        top1_agreement=top1,
        max_abs_error=float(error.max()),
        mean_abs_error=float(error.mean()),
        accuracy_fp32=accuracy_fp32,
        accuracy_int8=accuracy_int8,
    )


def _share(hits: npt.NDArray[np.bool_]) -> float:
    return float(np.mean(hits))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
