"""``open_device``: the one place that picks a Device implementation (device.py).

Kept apart from device.py so that the protocol imports nothing of torch, even inside a function,
and torch_device.py can import the protocol's types.
"""

from collections.abc import Iterable

from lumenrt.engine.gpu.device import Device, DeviceError
from lumenrt.placement.topology import pci_numa_node


def open_device(index: int) -> Device:
    """Device ``index`` of this process (a CUDA device through torch). The only place that picks
    an implementation; tests put a FakeDevice here. DeviceError with the reason when there is none."""
    from lumenrt.engine.gpu.torch_device import TorchCudaDevice  # torch: only when a GPU instance loads

    return TorchCudaDevice.open(index)


def gpu_numa_nodes(indices: Iterable[int]) -> dict[int, int]:
    """The NUMA node of each CUDA device in ``indices`` (-1: unknown), for placement (rule 9 of
    placement/plan.py): the PCI address CUDA gives the device, looked up in sysfs. All -1 where
    torch or CUDA is missing: planning does not fail for it (loading the instance says why)."""
    try:
        from lumenrt.engine.gpu.torch_device import pci_address
    except DeviceError:  # no torch: the GPU instance's load names the missing extra
        return dict.fromkeys(indices, -1)
    return {i: pci_numa_node(address) if (address := pci_address(i)) else -1 for i in indices}
