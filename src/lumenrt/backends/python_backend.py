"""Python backend: custom code in ``model.py``, for what no other backend runs.

``model.py`` defines a class with ``load()`` and ``infer(inputs) -> outputs``::

    class Model:
        def load(self, version_dir):  # or load(self); version_dir is the model's version folder
            self.scale = np.float32(2.0)

        def infer(self, inputs):  # dict of numpy arrays by input name, batch first
            return {"y": inputs["x"] * self.scale}  # dict of numpy arrays by output name

and optionally ``close()``, called when the instance is unloaded. The class is the one named by
``parameters.python.class``, else the only class in the file that has both ``load`` and
``infer``. Each model instance imports the file afresh under a name of its own, so instances share
no module state. ``infer`` must return exactly the outputs the config lists, as numpy arrays of the
listed datatypes; anything else fails the request with :class:`PythonModelError`.

The GIL is held while ``infer`` runs Python code: in thread mode, python models run one at a time
unless they call into code that releases it (numpy does, for large arrays); process mode gives
each worker its own interpreter.
"""

import importlib.util
import inspect
import itertools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from lumenrt.backends.base import Array, Placement, register
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec
from lumenrt.protocols import dtypes

CLASS_FIELD = "parameters.python.class"
_module_ids = itertools.count()


class PythonModelError(RuntimeError):
    """A python model's ``infer`` returned something other than the outputs its config lists."""


@dataclass(slots=True)
class PythonSession:
    """One model instance. Owns ``model`` and its module (removed from sys.modules at close)."""

    model: Any
    module_name: str
    outputs: tuple[TensorSpec, ...]  # () = whatever infer returns (the config lists none)
    label: str  # for errors: the model.py path

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        if self.model is None:
            raise RuntimeError("python session used after close()")
        result = self.model.infer(inputs)
        return self._checked(result)

    def close(self) -> None:
        model, self.model = self.model, None
        close = getattr(model, "close", None)
        try:
            if callable(close):
                close()
        finally:
            sys.modules.pop(self.module_name, None)

    def _checked(self, result: Any) -> dict[str, Array]:
        if not isinstance(result, Mapping):
            raise PythonModelError(
                f"{self.label}: infer() must return a dict of numpy arrays, got {type(result).__name__}"
            )
        for name, value in result.items():
            if not isinstance(value, np.ndarray):
                raise PythonModelError(
                    f"{self.label}: infer() output {name!r} must be a numpy array, got {type(value).__name__}"
                )
        if not self.outputs:
            return dict(result)
        expected = [spec.name for spec in self.outputs]
        if sorted(result) != sorted(expected):
            raise PythonModelError(
                f"{self.label}: infer() returned outputs {sorted(map(str, result))}, "
                f"the config lists {sorted(expected)}"
            )
        for spec in self.outputs:
            value = result[spec.name]
            if _datatype(value) != spec.datatype:
                raise PythonModelError(
                    f"{self.label}: infer() output {spec.name!r} has dtype {value.dtype}, "
                    f"the config says {spec.datatype}"
                )
        return {spec.name: result[spec.name] for spec in self.outputs}


def _datatype(value: Array) -> str:
    try:
        return dtypes.from_numpy(value.dtype)
    except ValueError:
        return str(value.dtype)  # no KServe V2 name: never equal to a config's datatype


class PythonBackend:
    name = "python"
    model_files: tuple[str, ...] = ("model.py",)

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        raise ConfigError(
            config.source or model_path,
            "inputs",
            "a python model does not declare its inputs and outputs: list them (name, datatype, dims) in the config",
        )

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> PythonSession:
        source = config.source or str(model_path)
        module_name = _module_name(config.name)
        module = _import(model_path, module_name)
        try:
            cls = _find_class(module, config.parameters.get("python"), model_path, source)
            model = cls()
            if _takes_one_argument(model.load):
                model.load(model_path.parent)
            else:
                model.load()
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return PythonSession(
            model=model, module_name=module_name, outputs=config.outputs, label=str(model_path)
        )


def _module_name(model_name: str) -> str:
    """A module name no other instance uses, so each instance has its own module state."""
    safe = re.sub(r"\W", "_", model_name)
    return f"lumenrt_python_model_{safe}_{next(_module_ids)}"


def _import(model_path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, model_path)
    if spec is None or spec.loader is None:
        raise ConfigError(model_path, "", "cannot be imported as a python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickle look classes up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ConfigError(model_path, "", f"import failed: {type(exc).__name__}: {exc}") from exc
    return module


def _has_model_methods(cls: type) -> bool:
    return callable(getattr(cls, "load", None)) and callable(getattr(cls, "infer", None))


def _find_class(module: ModuleType, options: Any, model_path: Path, source: str) -> type:
    """The class named by ``parameters.python.class``, else the only one with load and infer."""
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(source, "parameters.python", f"must be a mapping of option names, got {options!r}")
    options = options or {}
    for key in options:
        if key != "class":
            raise ConfigError(source, f"parameters.python.{key}", "unknown option (known: class)")
    name = options.get("class")
    if name is not None:
        cls = getattr(module, str(name), None)
        if not isinstance(cls, type):
            raise ConfigError(source, CLASS_FIELD, f"{model_path} defines no class {name!r}")
        if not _has_model_methods(cls):
            raise ConfigError(source, CLASS_FIELD, f"class {name!r} in {model_path} needs load() and infer()")
        return cls
    candidates = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == module.__name__ and _has_model_methods(value)
    ]
    if not candidates:
        raise ConfigError(model_path, "", "defines no class with load() and infer()")
    if len(candidates) > 1:
        names = ", ".join(sorted(cls.__name__ for cls in candidates))
        raise ConfigError(source, CLASS_FIELD, f"{model_path} has several model classes ({names}): name one")
    return candidates[0]


def _takes_one_argument(method: Any) -> bool:
    """True if the bound ``load`` accepts one positional argument (the version folder)."""
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 1 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


register(PythonBackend())
