"""Staging buffers of one GPU instance: where a batch waits on the host to go to the device, and
where its answer comes back.

Per instance, ``SETS`` (two) staging sets, each with, for every input, a host buffer (page-locked
unless ``optimization.input_pinned_memory.enable`` is false, or ``optimization.cuda.direct_copies``
sends requests to the device without it) and a device buffer, and for every
output a device buffer and a host buffer (``output_pinned_memory``), all sized for
``max_batch_size`` rows (one row for a model without a batch dimension), and the set's six
timing events. Two sets so that one batch can be on the device while the worker answers the
previous one and gathers the next into the other set (pipeline.py).

Ownership: ``allocate`` makes every buffer and event once, at load; the sets own them for the
instance's life (``StagingSet`` holds the only references) and ``Pipeline.close`` drops them. Nothing
here is allocated per request: the worker gathers a batch's inputs straight into ``host_in`` and
answers from copies of ``host_out`` rows.

Only fixed shapes: every input and output dim other than the batch dim must be given (> 0) and
numeric (no BYTES), since the buffers are sized at load; ``StagingPlan.for_config`` refuses
others, naming the field.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumenrt.engine.config import ConfigError, GpuOptions, ModelConfig, TensorSpec
from lumenrt.engine.gpu.device import Device, HostBuffer
from lumenrt.protocols import dtypes

SETS = 2  # one batch on the device while the other set is answered and refilled


@dataclass(frozen=True, slots=True)
class TensorSlot:
    name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]  # one row's shape

    def nbytes(self, rows: int) -> int:
        return rows * int(np.prod(self.dims, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class StagingPlan:
    rows: int  # max_batch_size, or 1 for a model without a batch dimension
    batched: bool  # False: the model takes no batch dimension (buffers still have a leading 1)
    inputs: tuple[TensorSlot, ...]
    outputs: tuple[TensorSlot, ...]

    @classmethod
    def for_config(cls, config: ModelConfig) -> "StagingPlan":
        source = config.source or config.name
        return cls(
            rows=max(config.max_batch_size, 1),
            batched=config.max_batch_size > 0,
            inputs=tuple(_slot(s, f"inputs[{i}]", source) for i, s in enumerate(config.inputs)),
            outputs=tuple(_slot(s, f"outputs[{i}]", source) for i, s in enumerate(config.outputs)),
        )

    @property
    def host_bytes(self) -> int:
        """Host staging memory of one instance (every set)."""
        return SETS * sum(t.nbytes(self.rows) for t in (*self.inputs, *self.outputs))

    @property
    def device_bytes(self) -> int:
        """Device staging memory of one instance (every set)."""
        return self.host_bytes


def _slot(spec: TensorSpec, path: str, source: str) -> TensorSlot:
    if spec.datatype == "BYTES":
        raise ConfigError(source, f"{path}.datatype", "BYTES tensors cannot go to a GPU instance")
    for j, d in enumerate(spec.dims):
        if d < 0:
            raise ConfigError(
                source,
                f"{path}.dims[{j}]",
                "a GPU instance needs fixed dims (its staging buffers are sized at load): give the size",
            )
    return TensorSlot(spec.name, dtypes.to_numpy(spec.datatype), spec.dims)


@dataclass(slots=True)
class StagingSet:
    """One set of buffers and events (see the top). ``rows`` and ``launch``: the batch it holds
    now (written by the worker before it issues the batch)."""

    index: int
    host_in: dict[str, HostBuffer]
    dev_in: dict[str, Any]
    dev_out: dict[str, Any]
    host_out: dict[str, HostBuffer]
    # copy in, compute and copy out, each between a start and an end event (pipeline.py)
    copy_in_start: Any
    copy_in_end: Any
    compute_start: Any
    compute_end: Any
    copy_out_start: Any
    copy_out_end: Any
    graphs: dict[int, Callable[[], None]] = field(default_factory=dict)  # rows -> captured launch
    rows: int = 0

    def device_views(self, buffers: dict[str, Any], rows: int, batched: bool) -> dict[str, Any]:
        """The model's view of device buffers for ``rows`` rows (a view: no device memory)."""
        return {name: buf[:rows] if batched else buf[0] for name, buf in buffers.items()}


def allocate(device: Device, plan: StagingPlan, options: GpuOptions) -> list[StagingSet]:
    """The instance's staging sets, allocated once (see the top)."""
    lead = plan.rows
    sets = []
    for index in range(SETS):
        events = [device.new_event(blocking=not options.busy_wait_events) for _ in range(6)]
        sets.append(
            StagingSet(
                index,
                {
                    # with direct copies only warm-up reads them: not page-locked
                    t.name: device.host_buffer(
                        (lead, *t.dims), t.dtype, pinned=options.pinned_input and not options.direct_copies
                    )
                    for t in plan.inputs
                },
                {t.name: device.device_buffer((lead, *t.dims), t.dtype) for t in plan.inputs},
                {t.name: device.device_buffer((lead, *t.dims), t.dtype) for t in plan.outputs},
                {
                    t.name: device.host_buffer((lead, *t.dims), t.dtype, pinned=options.pinned_output)
                    for t in plan.outputs
                },
                *events,
            )
        )
    return sets
