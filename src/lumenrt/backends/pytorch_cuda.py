"""A PyTorch model as a GPU instance's program (engine/gpu/device.py ``DeviceProgram``).

The module (TorchScript ``model.pt`` or ``torch.export`` ``model.pt2``) is loaded onto the
instance's CUDA device once. ``run`` is called by the pipeline with the instance's compute stream
current and device views of its staging buffers: it calls the module under
``torch.inference_mode()`` (and ``torch.autocast`` when ``optimization.cuda.autocast`` is FP16 or
BF16), then copies each output into its staging buffer (``copy_`` converts an FP16 output back
to the config's datatype), all enqueued on that stream: nothing here waits for the device. The
same call is what a CUDA graph captures (pipeline.py), so it allocates only from the caching
allocator and never synchronizes.

Imported only when a GPU instance of a PyTorch model loads (``PyTorchBackend.load_gpu``).
"""

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export.passes import move_to_device_pass

from lumenrt.engine.config import ModelConfig
from lumenrt.engine.gpu.device import DeviceError

_AUTOCAST = {"FP16": torch.float16, "BF16": torch.bfloat16}


class TorchCudaProgram:
    """One GPU instance's module. Owns ``module`` (its weights on the device)."""

    def __init__(self, module: Any, config: ModelConfig) -> None:
        self.module: Any = module
        self.input_names = tuple(spec.name for spec in config.inputs)
        self.output_names = tuple(spec.name for spec in config.outputs)
        self.autocast = _AUTOCAST.get(config.gpu.autocast)
        # under graph capture autocast's cast cache must be off (PyTorch's CUDA graphs notes)
        self._cache_casts = not config.gpu.graphs
        self.weight_bytes = sum(
            t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers())
        )

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        module = self.module
        if module is None:
            raise RuntimeError("pytorch GPU program used after close()")
        args = [inputs[name] for name in self.input_names]
        cast = (
            torch.autocast("cuda", dtype=self.autocast, cache_enabled=self._cache_casts)
            if self.autocast is not None
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), cast:
            result = module(*args)
        for name, value in zip(self.output_names, self._values(result), strict=True):
            outputs[name].copy_(value.reshape(outputs[name].shape))

    def _values(self, result: Any) -> Sequence[torch.Tensor]:
        names = self.output_names
        if isinstance(result, torch.Tensor):
            values: Sequence[Any] = (result,)
        elif isinstance(result, Mapping):
            values = [result[name] for name in names]
        elif isinstance(result, tuple | list):
            values = result
        else:
            raise RuntimeError(f"the model returned {type(result).__name__}, not a tensor, tuple or dict")
        if len(values) != len(names):
            raise RuntimeError(f"the model returned {len(values)} outputs, the config lists {len(names)}")
        return values

    def close(self) -> None:
        self.module = None


def load_module(model_path: Path, device: Any) -> Any:
    """The model file's module on ``device`` (a torch.device), in eval mode."""
    if model_path.suffix == ".pt2":
        # the pass moves the graph's constants and device arguments too, not only its weights
        program = move_to_device_pass(torch.export.load(str(model_path)), device)
        return program.module()
    module = torch.jit.load(str(model_path), map_location=device)  # type: ignore[no-untyped-call]
    module.eval()
    return module


def device_of(device: Any) -> torch.device:
    """The torch device of a TorchCudaDevice (the only Device a PyTorch program runs on)."""
    target = getattr(device, "torch_device", None)
    if not isinstance(target, torch.device):
        raise DeviceError(f"{device.name}: a PyTorch model runs on a CUDA device through torch only")
    return target
