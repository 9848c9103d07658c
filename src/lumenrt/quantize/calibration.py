"""Input samples, for calibration and for the held-out comparison, and the calibration reader.

A source is a folder or ``builtin:NAME``:

  folder        one ``<input name>.npy`` per model input, the samples stacked on axis 0 (the model's
                first axis), the same number of samples in each. Everything is checked from the
                .npy headers (names, dtype, shape, sample counts) before any data is read; then the
                files are memory-mapped, so that only the samples used are read.
  builtin:NAME  a built-in model's own data (models/builtin.py): for calibration, digits rows of
                the training split or images of a calibration seed; held out, the held-out digits
                with their labels or the example images. The two never overlap.

A folder given only for calibration is split when a held-out set is needed too: its last quarter
is held out (``split``), so the agreement is never measured on what the ranges were set from.
"""

import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lumenrt.quantize.errors import UsageError
from lumenrt.quantize.model_source import BUILTIN_PREFIX, InputSpec

HELD_OUT_FRACTION = 0.25  # of a folder given only with --calibration, as the built-in models split their data
# Calibration samples used at most (--calibration-samples). Measured on the built-in SqueezeNet: the
# same top-1 agreement (31%) from 16 images as from 64; 64 adds ~1 s to quantizing it here.
CALIBRATION_SAMPLES = 64


@dataclass(frozen=True, slots=True)
class Samples:
    """Input arrays by name, samples on axis 0 (the same count in each), and labels where known."""

    arrays: Mapping[str, npt.NDArray[Any]]
    source: str  # as the user gave it
    labels: npt.NDArray[np.int64] | None = None

    @property
    def count(self) -> int:
        return len(next(iter(self.arrays.values())))

    def take(self, start: int, stop: int) -> "Samples":
        labels = None if self.labels is None else self.labels[start:stop]
        return Samples({k: v[start:stop] for k, v in self.arrays.items()}, self.source, labels)

    def batches(self, size: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
        """Feeds of ``size`` samples (the last may be short), contiguous in memory."""
        for start in range(0, self.count, size):
            yield {k: np.ascontiguousarray(v[start : start + size]) for k, v in self.arrays.items()}


class SampleReader:
    """ONNX Runtime's calibration data reader over ``Samples``, ``batch`` samples a feed.
    (``CalibrationDataReader`` accepts any class with ``get_next``: its ``__subclasshook__``.)"""

    def __init__(self, samples: Samples, batch: int) -> None:
        self._feeds = samples.batches(batch)

    def get_next(self) -> dict[str, npt.NDArray[Any]] | None:
        return next(self._feeds, None)


def read_samples(
    source: str, inputs: Sequence[InputSpec], flag: str, limit: int | None, *, held_out: bool
) -> Samples:
    """At most ``limit`` samples from ``source`` (a folder or ``builtin:NAME``), checked against the
    model's inputs; ``held_out`` picks a built-in model's held-out data instead of its calibration
    data. UsageError naming ``flag`` for anything that does not fit."""
    if limit is not None and limit < 1:
        raise UsageError(f"{flag}-samples {limit}: must be >= 1")
    if source.startswith(BUILTIN_PREFIX):
        return _builtin(source, inputs, flag, limit, held_out=held_out)
    return read_folder(Path(source), inputs, flag, limit)


def read_folder(folder: Path, inputs: Sequence[InputSpec], flag: str, limit: int | None) -> Samples:
    where = f"{flag} {folder}"
    if not folder.is_dir():
        raise UsageError(f"{where}: {'not a folder' if folder.exists() else 'no such folder'}")
    files = {p.stem: p for p in sorted(folder.glob("*.npy"))}
    expected = ", ".join(f"{spec.name}.npy" for spec in inputs)
    if not files:
        raise UsageError(f"{where}: no .npy files (expected one per model input: {expected})")
    names = [spec.name for spec in inputs]
    for stem in files:
        if stem not in names:
            close = difflib.get_close_matches(stem, names, n=1)
            hint = f" (did you mean {close[0]}.npy?)" if close else ""
            raise UsageError(f"{where}: {stem}.npy names no input of the model (expected {expected}){hint}")
    headers = {}
    for spec in inputs:
        path = files.get(spec.name)
        if path is None:
            raise UsageError(
                f"{where}: no {spec.name}.npy for the model's input {spec.name!r} {spec.shape_text}"
            )
        headers[spec.name] = _header(path, f"{where}: {path.name}")
    count = check_shapes(
        {name: shape for name, (shape, _) in headers.items()},
        {name: dtype for name, (_, dtype) in headers.items()},
        inputs,
        where,
        lambda name: f"{name}.npy",
    )
    if limit is not None:
        count = min(count, limit)
    arrays = {}
    for spec in inputs:
        path = files[spec.name]
        try:
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:  # a truncated file: shorter than its header says
            raise UsageError(f"{where}: {path.name}: cannot be read: {exc}") from None
        arrays[spec.name] = mapped[:count]
    return Samples(arrays, str(folder))


def check_shapes(
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, np.dtype[Any]],
    inputs: Sequence[InputSpec],
    where: str,
    label: Callable[[str], str],
) -> int:
    """The number of samples, once every input's dtype, rank and fixed dimensions (axis 0 counts
    samples) fit the model and the counts agree; UsageError naming ``label(input name)``."""
    count = None
    first = ""
    for spec in inputs:
        shape, dtype, name = shapes[spec.name], dtypes[spec.name], label(spec.name)
        if dtype != spec.dtype:
            raise UsageError(
                f"{where}: {name} holds {dtype}, but the model's input {spec.name!r} takes {spec.dtype}"
            )
        fits = len(shape) == len(spec.dims) and all(
            want is None or got == want for got, want in zip(shape[1:], spec.dims[1:], strict=True)
        )
        if not fits:
            raise UsageError(
                f"{where}: {name} has shape {list(shape)}, but the model's input {spec.name!r} is "
                f"{spec.shape_text} (axis 0 counts the samples)"
            )
        fixed = spec.dims[0]
        if fixed is not None and shape[0] % fixed:
            raise UsageError(
                f"{where}: {name} has {shape[0]} samples, but the model's input {spec.name!r} takes "
                f"them {fixed} at a time: give a multiple of {fixed}"
            )
        if count is None:
            count, first = shape[0], name
        elif shape[0] != count:
            raise UsageError(f"{where}: {name} has {shape[0]} samples but {first} has {count}")
    if not count:
        raise UsageError(f"{where}: {first} holds no samples")
    return count


def split(samples: Samples, fixed_batch: int | None) -> tuple[Samples, Samples]:
    """(calibration, held out): the last ``HELD_OUT_FRACTION`` held out, at least one sample (or
    one fixed batch) on each side."""
    step = fixed_batch or 1
    groups = samples.count // step
    if groups < 2:
        raise UsageError(
            f"--calibration {samples.source}: {samples.count} sample(s): too few to hold some out for "
            "the agreement (give more, or a separate --held-out)"
        )
    held = max(1, round(groups * HELD_OUT_FRACTION))
    cut = (groups - held) * step
    return samples.take(0, cut), samples.take(cut, samples.count)


def whole_batches(samples: Samples, fixed_batch: int | None, flag: str) -> Samples:
    """``samples`` cut to whole batches, for a model whose inputs fix the batch size."""
    if fixed_batch is None or samples.count % fixed_batch == 0:
        return samples
    if samples.count < fixed_batch:
        raise UsageError(
            f"{flag} {samples.source}: {samples.count} sample(s), fewer than the model's fixed batch of {fixed_batch}"
        )
    return samples.take(0, samples.count - samples.count % fixed_batch)


def _header(path: Path, where: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype from the .npy header alone (no data read)."""
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{where}: not a .npy file ({exc})") from None
    if dtype.hasobject:
        raise UsageError(f"{where}: holds Python objects (only plain numeric arrays are read)")
    if not shape:
        raise UsageError(f"{where}: holds a scalar; axis 0 must count the samples")
    return tuple(int(d) for d in shape), np.dtype(dtype)


def _builtin(
    source: str, inputs: Sequence[InputSpec], flag: str, limit: int | None, *, held_out: bool
) -> Samples:
    from lumenrt.models.builtin import builtin_calibration, builtin_held_out
    from lumenrt.quantize.model_source import builtin_model_path

    name = source[len(BUILTIN_PREFIX) :]
    builtin_model_path(name, flag)  # the name is checked (UsageError) before data is made
    labels = None
    if held_out:
        arrays, labels = builtin_held_out(name, limit)
    else:
        arrays = builtin_calibration(name, CALIBRATION_SAMPLES if limit is None else limit)
    missing = [spec.name for spec in inputs if spec.name not in arrays]
    if missing:
        raise UsageError(f"{flag} {source}: has no input {missing[0]!r}: not data for this model")
    where = f"{flag} {source}"
    check_shapes(
        {k: v.shape for k, v in arrays.items()}, {k: v.dtype for k, v in arrays.items()}, inputs, where, repr
    )
    return Samples({spec.name: arrays[spec.name] for spec in inputs}, source, labels)
