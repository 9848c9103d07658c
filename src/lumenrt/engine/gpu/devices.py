"""``open_device``: the one place that picks a Device implementation (device.py).

Kept apart from device.py so that the protocol imports nothing of torch, even inside a function,
and torch_device.py can import the protocol's types.
"""

from lumenrt.engine.gpu.device import Device


def open_device(index: int) -> Device:
    """Device ``index`` of this process (a CUDA device through torch). The only place that picks
    an implementation; tests put a FakeDevice here. DeviceError with the reason when there is none."""
    from lumenrt.engine.gpu.torch_device import TorchCudaDevice  # torch: only when a GPU instance loads

    return TorchCudaDevice.open(index)
