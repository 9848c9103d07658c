"""What GPU instances report: device stage times, device memory, the device's utilization.

Each GPU worker writes its own ``DeviceStats`` (one writer, no lock, like WorkerStats); the
statistics add them up per model at read time (``gpu_statistics``), never on the request path.
Memory per model is what its instances hold for themselves (weights, staging buffers) exactly;
activations come from the device library's caching allocator, shared by the process, and are in
the device's figures (``memory_used_bytes`` of this process, NVML's for the whole device).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lumenrt.engine.gpu.device import Device
from lumenrt.engine.gpu.pipeline import DeviceTimes


@dataclass(slots=True)
class DeviceStats:
    """One GPU instance's counts, written by its worker only."""

    batches: int = 0  # batches the device ran to the end
    failures: int = 0  # batches the device (or the launch) failed
    direct_batches: int = 0  # batches whose inputs went to the device with no gather (direct_copies)
    copy_in_ns: int = 0
    compute_ns: int = 0
    copy_out_ns: int = 0

    def add(self, times: DeviceTimes) -> None:
        self.batches += 1
        self.copy_in_ns += times.copy_in_ns
        self.compute_ns += times.compute_ns
        self.copy_out_ns += times.copy_out_ns


@dataclass(frozen=True, slots=True)
class InstanceReport:
    """What the statistics read of one loaded GPU instance."""

    device: Device
    owned_bytes: int  # its weights and staging buffers on the device
    pinned_bytes: int  # its page-locked host staging
    stats: DeviceStats
    registered_bytes: int = 0  # direct copies: the model's region, page-locked in place (shared)


def gpu_statistics(instances: Iterable[InstanceReport]) -> dict[str, Any]:
    """A model version's GPU figures: stage times summed over its instances, the device memory they
    hold, and per device this process's use and NVML's utilization (absent without nvidia-ml-py)."""
    listed = list(instances)
    devices: dict[int, Device] = {i.device.index: i.device for i in listed}
    per_device: dict[str, Any] = {}
    for index, device in sorted(devices.items()):
        entry: dict[str, Any] = {
            "name": device.name,
            "instances": sum(1 for i in listed if i.device.index == index),
            "model_memory_bytes": sum(i.owned_bytes for i in listed if i.device.index == index),
            "process_memory_bytes": device.memory_used_bytes(),
        }
        nvml = device.utilization()
        if nvml is not None:
            entry["nvml"] = nvml
        per_device[str(index)] = entry
    return {
        "instances": len(listed),
        "batches": sum(i.stats.batches for i in listed),
        "failures": sum(i.stats.failures for i in listed),
        "direct_batches": sum(i.stats.direct_batches for i in listed),
        "copy_in_ns": sum(i.stats.copy_in_ns for i in listed),
        "compute_ns": sum(i.stats.compute_ns for i in listed),
        "copy_out_ns": sum(i.stats.copy_out_ns for i in listed),
        "memory_bytes": sum(i.owned_bytes for i in listed),
        "pinned_bytes": sum(i.pinned_bytes for i in listed),
        # the instances of a model share one registration: counted once
        "registered_bytes": max((i.registered_bytes for i in listed), default=0),
        "devices": per_device,
    }
