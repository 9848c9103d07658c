"""PyTorch backend: a TorchScript (``model.pt``) or ``torch.export`` (``model.pt2``) file on CPU,
and on CUDA for GPU instances (``load_gpu``: backends/pytorch_cuda.py, engine/gpu/).

The model is called with its inputs as positional tensors, in the order the config lists them,
under ``torch.inference_mode()``. Inputs are shared with numpy, not copied (``torch.from_numpy``,
or DLPack for a read-only array such as a view of a shared-memory slot): a model must not write
to its inputs. A model may return one tensor, a tuple/list of tensors (matched to the config's
outputs by position) or a dict of tensors (by name).

Neither file format tells its inputs and outputs reliably (TorchScript keeps no shapes or dtypes),
so the config must list them. torch 2.13 deprecates TorchScript: prefer ``model.pt2``.

Threads: ``torch.set_num_threads`` is process-wide, not per model instance. In process mode each
worker sets its own; in thread mode the workers share torch's intra-op pool and the last load
sets its size (all workers are given the same count, so it is the same value).
"""

import contextlib
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from lumenrt.backends.base import Array, Placement, register
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec
from lumenrt.protocols import dtypes

_MUST_LIST = (
    "TorchScript and torch.export files do not tell their inputs and outputs reliably: "
    "list them (name, datatype, dims) in the config"
)


@dataclass(slots=True)
class PyTorchSession:
    """One model instance. Owns ``module``."""

    module: torch.nn.Module | torch.jit.ScriptModule | None
    inputs: tuple[tuple[str, np.dtype[Any]], ...]  # in the order the model takes them
    output_names: tuple[str, ...]

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        module = self.module
        if module is None:
            raise RuntimeError("pytorch session used after close()")
        try:
            arrays = [np.ascontiguousarray(inputs[name], dtype=dtype) for name, dtype in self.inputs]
        except KeyError as exc:
            raise ValueError(f"missing input {exc.args[0]!r}") from None
        tensors = [_as_tensor(array) for array in arrays]
        with torch.inference_mode():
            result = module(*tensors)
        return self._outputs(result)

    def close(self) -> None:
        self.module = None

    def _outputs(self, result: Any) -> dict[str, Array]:
        names = self.output_names
        if isinstance(result, torch.Tensor):
            values: Sequence[Any] = (result,)
        elif isinstance(result, tuple | list):
            values = result
        elif isinstance(result, Mapping):
            missing = [name for name in names if name not in result]
            if missing:
                raise RuntimeError(
                    f"the model returned no {missing} (it returned {sorted(map(str, result))})"
                )
            values = [result[name] for name in names]
        else:
            raise RuntimeError(f"the model returned {type(result).__name__}, not a tensor, tuple or dict")
        if len(values) != len(names):
            raise RuntimeError(f"the model returned {len(values)} outputs, the config lists {len(names)}")
        outputs: dict[str, Array] = {}
        for name, value in zip(names, values, strict=True):
            if not isinstance(value, torch.Tensor):
                raise RuntimeError(f"output {name!r} is a {type(value).__name__}, not a tensor")
            outputs[name] = value.detach().numpy()
        return outputs


def _as_tensor(array: Array) -> torch.Tensor:
    """A tensor over the array's memory (no copy). torch.from_numpy warns on a read-only array
    (and the warning is an error under pytest); DLPack shares it without the warning."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    return from_dlpack(array)


# torch.export.load keeps its deserializer in a global ("_CURRENT_DESERIALIZER is already set" when
# two threads load at once, found by the engine tests), and warnings.catch_warnings below is
# process-wide: loads are serialised. Load time only, never on the request path.
_LOAD_LOCK = threading.Lock()


class PyTorchBackend:
    name = "pytorch"
    model_files: tuple[str, ...] = ("model.pt", "model.pt2")

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        raise ConfigError(config.source or model_path, "inputs", _MUST_LIST)

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> PyTorchSession:
        source = config.source or str(model_path)
        self._check(config, source)
        inputs = tuple(
            (spec.name, _input_dtype(spec, index, source)) for index, spec in enumerate(config.inputs)
        )
        _set_threads(placement)
        module: torch.nn.Module | torch.jit.ScriptModule
        with _LOAD_LOCK:  # thread-mode workers load at once; neither loader is thread-safe
            if model_path.suffix == ".pt2":
                with quiet_loader_warnings():
                    module = torch.export.load(str(model_path)).module()
            else:
                module = _load_torchscript(model_path)
                module.eval()
        return PyTorchSession(
            module=module, inputs=inputs, output_names=tuple(spec.name for spec in config.outputs)
        )

    def check_gpu(self, config: ModelConfig) -> None:
        """The config as for CPU (the device itself says whether there is CUDA)."""
        source = config.source or config.name
        self._check(config, source)
        for index, spec in enumerate(config.inputs):
            _input_dtype(spec, index, source)

    def load_gpu(self, model_path: Path, config: ModelConfig, device: Any, stream: Any) -> Any:
        """A GPU instance's program (backends/pytorch_cuda.py): the module on the device."""
        from lumenrt.backends.pytorch_cuda import TorchCudaProgram, device_of, load_module

        target = device_of(device)
        with _LOAD_LOCK, quiet_loader_warnings():
            module = load_module(model_path, target)
        return TorchCudaProgram(module, config)

    def _check(self, config: ModelConfig, source: str) -> None:
        if not config.inputs or not config.outputs:
            raise ConfigError(source, "inputs" if not config.inputs else "outputs", _MUST_LIST)
        options = config.parameters.get("pytorch")
        if options:
            raise ConfigError(
                source, f"parameters.pytorch.{next(iter(options))}", "unknown option (none exist)"
            )


@contextlib.contextmanager
def quiet_loader_warnings() -> Iterator[None]:
    """Silence what torch's loaders say on every load that is not about the model: torch 2.13
    deprecates TorchScript; torch 2.11's torch.export.load builds its weights over a read-only
    buffer and says so (seen on the GPU machine). Load time only, under _LOAD_LOCK
    (catch_warnings is process-wide)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`torch.jit.load` is deprecated", category=DeprecationWarning
        )
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        yield


def _load_torchscript(model_path: Path) -> torch.jit.ScriptModule:
    with quiet_loader_warnings():  # serving TorchScript is this backend's job
        # torch.jit.load has no annotations in torch 2.13
        module: torch.jit.ScriptModule = torch.jit.load(str(model_path), map_location="cpu")  # type: ignore[no-untyped-call]
    return module


def _input_dtype(spec: TensorSpec, index: int, source: str) -> np.dtype[Any]:
    try:
        dtype = dtypes.to_numpy(spec.datatype)
    except ValueError as exc:
        raise ConfigError(source, f"inputs[{index}].datatype", str(exc)) from None
    if dtype.kind == "O":
        raise ConfigError(
            source, f"inputs[{index}].datatype", "BYTES tensors cannot be given to a torch model"
        )
    return dtype


def _set_threads(placement: Placement) -> None:
    torch.set_num_threads(placement.intra_op_threads)  # process-wide: see the module docstring
    # torch allows this once, before any inter-op work; later loads keep the first setting
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(placement.inter_op_threads)


register(PyTorchBackend())
