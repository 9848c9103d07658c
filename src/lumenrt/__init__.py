"""lumenrt: a low-latency inference server with a small native core.

The in-process API, for a program that serves models itself (no sockets)::

    from lumenrt import Engine

    with Engine() as engine:  # the built-in repository, its default models loaded
        result = engine.infer("digits_mlp", {"input": x})
        result.outputs["probabilities"]

    with Engine("models/", EngineConfig(worker_mode="process")) as engine:
        result = await engine.infer_async("squeezenet", {"data": image}, timeout_s=0.5)

The public names below are imported on first use, so ``import lumenrt`` (and ``lumenrt.native``,
the native core: lock-free rings, arenas, futex waits, shared memory) stays cheap. Every error a
request can raise is an ``EngineError``; a model name the repository does not hold raises
``ModelNotFound``.
"""

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from lumenrt.engine.engine import Engine, InferResult
    from lumenrt.engine.repository import ModelNotFound, ModelRepository
    from lumenrt.engine.request import (
        EngineError,
        InvalidInput,
        ModelNotReady,
        QueueFull,
        RequestCancelled,
        RequestTimeout,
        StageTimes,
        WorkerDied,
    )
    from lumenrt.engine.server_config import EngineConfig

# public name -> the module that defines it
_PUBLIC = {
    "Engine": "lumenrt.engine.engine",
    "InferResult": "lumenrt.engine.engine",
    "EngineConfig": "lumenrt.engine.server_config",
    "ModelRepository": "lumenrt.engine.repository",
    "ModelNotFound": "lumenrt.engine.repository",
    "StageTimes": "lumenrt.engine.request",
    "EngineError": "lumenrt.engine.request",
    "InvalidInput": "lumenrt.engine.request",
    "ModelNotReady": "lumenrt.engine.request",
    "QueueFull": "lumenrt.engine.request",
    "RequestCancelled": "lumenrt.engine.request",
    "RequestTimeout": "lumenrt.engine.request",
    "WorkerDied": "lumenrt.engine.request",
}

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "InferResult",
    "InvalidInput",
    "ModelNotFound",
    "ModelNotReady",
    "ModelRepository",
    "QueueFull",
    "RequestCancelled",
    "RequestTimeout",
    "StageTimes",
    "WorkerDied",
    "__version__",
]


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'lumenrt' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
