"""The one small interface every backend implements, and the registry that picks one by name.

A backend loads one model version into a session owned by exactly one worker (one model instance
per worker). ``run`` receives batch-first numpy arrays keyed by input name and returns arrays keyed
by output name; backends whose library releases the GIL during compute (ONNX Runtime, XGBoost,
PyTorch) let thread-mode workers run in parallel.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec

if TYPE_CHECKING:
    from lumenrt.engine.gpu.device import Device, DeviceProgram

Array = npt.NDArray[np.generic]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one model instance runs: the cores its worker is pinned to, the compute threads its
    session may use (one per core: the worker's thread and its backend's pool), and the NUMA node
    its memory is bound to (placement/plan.py plans them for all models together)."""

    cores: tuple[int, ...]
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    node: int = -1  # -1: no binding (the cores span nodes, or nothing was planned)
    bind_memory: bool = True  # set the worker's memory policy to ``node`` (else: first touch only)
    gpu: int = -1  # a GPU instance's CUDA device (its worker feeds it: engine/gpu/); -1: a CPU instance


class BackendSession(Protocol):
    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...
    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    model_files: tuple[str, ...]  # file names accepted in a version folder, e.g. ("model.onnx",)

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """Inputs and outputs read from the model file, for what the config does not say.
        Raise ConfigError if the file cannot say (the config must then list them)."""
        ...

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> BackendSession: ...


@runtime_checkable
class GpuBackend(Protocol):
    """A backend whose models can run as GPU instances (KIND_GPU; engine/gpu/)."""

    name: str

    def check_gpu(self, config: ModelConfig) -> None:
        """What running ``config`` on a GPU needs of this install, checked before any device is
        opened: ConfigError naming what to install (e.g. onnxruntime-gpu)."""
        ...

    def load_gpu(
        self, model_path: Path, config: ModelConfig, device: "Device", stream: Any
    ) -> "DeviceProgram":
        """The model on ``device``, its work enqueued on ``stream`` (the instance's compute stream)."""
        ...


REGISTRY: dict[str, Backend] = {}

# The bundled backends by name, and the module that registers each. One whose library is not
# installed (the PyTorch backend without the 'torch' extra) is left out of REGISTRY; asking for it
# is answered with the extra to install.
BUNDLED: dict[str, str] = {
    "onnxruntime": "onnxruntime_backend",
    "xgboost": "xgboost_backend",
    "pytorch": "pytorch_backend",
    "python": "python_backend",
}
_unavailable: dict[str, str] = {}  # bundled backend name -> why it could not be imported
# Which bundled backend reads a model file, by its name (each backend's ``model_files``, known here
# without importing its library; tests/unit/test_model_dir.py keeps the two in step)
BUNDLED_MODEL_FILES: dict[str, str] = {
    "model.onnx": "onnxruntime",
    "model.json": "xgboost",
    "model.ubj": "xgboost",
    "model.bst": "xgboost",
    "model.pt": "pytorch",
    "model.pt2": "pytorch",
    "model.py": "python",
}


def register(backend: Backend) -> Backend:
    REGISTRY[backend.name] = backend
    return backend


def get_backend(name: str, source: str = "<config>") -> Backend:
    """The backend ``name``; a bundled one is imported on first use, alone: a worker process of
    a Python model does not import PyTorch or XGBoost (seconds of start-up and hundreds of MB)."""
    backend = REGISTRY.get(name)
    if backend is not None:
        return backend
    if name in BUNDLED and name not in _unavailable:
        _import_bundled(name)
        backend = REGISTRY.get(name)
        if backend is not None:
            return backend
    if name in _unavailable:
        raise ConfigError(source, "backend", _unavailable[name])
    known = ", ".join(sorted(set(REGISTRY) | set(BUNDLED)))
    raise ConfigError(source, "backend", f"unknown backend {name!r} (known: {known})")


def _import_bundled(name: str) -> None:
    """Import one bundled backend (it registers itself); a missing optional library only removes
    it, and ``get_backend`` then names the extra that brings it. A race only imports twice:
    imports and these writes are idempotent."""
    import importlib

    from lumenrt.extras import MissingExtra, extra_providing

    try:
        importlib.import_module(f"lumenrt.backends.{BUNDLED[name]}")
    except ImportError as exc:
        extra = extra_providing(exc.name or "") if isinstance(exc, ModuleNotFoundError) else None
        why = MissingExtra(extra, (exc.name or extra,)) if extra else f"cannot be loaded: {exc}"
        _unavailable[name] = f"{name!r} {why}"
