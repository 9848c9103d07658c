"""The model to quantize: an ONNX file, or ``builtin:NAME`` (a built-in ONNX model, taken from the
built-in repository), read once for what the other steps need: its inputs, opset and operators,
its size, and its config where it has one (a repository's ``<model>/config.yaml`` above its
version folder, or a ``config.yaml`` beside the file), for the preferred batch and the session
options the server would use."""

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from lumenrt.engine.config import ConfigError, ModelConfig
from lumenrt.quantize.errors import UsageError

BUILTIN_PREFIX = "builtin:"
DEFAULT_BATCH = 8  # guessed: the preferred batch when neither --batch nor a config says one


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One graph input (initializers excluded)."""

    name: str
    dims: tuple[int | None, ...]  # None: a named or unknown dimension
    dtype: np.dtype[Any]
    shape_text: str  # as the model writes it: "[batch, 3, 224, 224]"


@dataclass(frozen=True, slots=True)
class ModelSource:
    path: Path
    label: str  # "builtin:digits_mlp", or the path as given
    builtin: str | None  # the built-in model's name, if it is one
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    opset: int  # of the default ONNX domain
    op_types: frozenset[str]  # every operator, subgraphs included
    config: ModelConfig | None
    size_bytes: int

    @property
    def fixed_batch(self) -> int | None:
        """The first dimension, when every input fixes it to the same size: then every run takes
        exactly that many samples."""
        firsts = {spec.dims[0] for spec in self.inputs}
        return next(iter(firsts)) if len(firsts) == 1 else None

    @property
    def session_options(self) -> Any:
        """The config's ``parameters.onnxruntime`` (the server's session options), if any."""
        return None if self.config is None else self.config.parameters.get("onnxruntime")


def open_model(text: str) -> ModelSource:
    """The model that ``MODEL`` names; UsageError naming it when it is missing, not ONNX, or has
    inputs that are not tensors with a rank."""
    builtin = None
    if text.startswith(BUILTIN_PREFIX):
        builtin = text[len(BUILTIN_PREFIX) :]
        path = builtin_model_path(builtin, "MODEL")
    else:
        path = Path(text)
        if not path.exists():
            raise UsageError(f"MODEL {text}: no such file")
        if not path.is_file():
            raise UsageError(f"MODEL {text}: not a file (an .onnx model file, or builtin:NAME)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # whatever protobuf or onnx raise for a file that is not a model
        raise UsageError(f"MODEL {text}: not an ONNX model ({type(exc).__name__}: {exc})") from None
    if model.ir_version == 0 or not model.graph.node:
        raise UsageError(f"MODEL {text}: not an ONNX model (no IR version or no graph nodes)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ModelSource(
        path=path,
        label=text,
        builtin=builtin,
        inputs=_inputs(model, text),
        outputs=tuple(o.name for o in model.graph.output),
        opset=opset,
        op_types=frozenset(_op_types(model.graph)),
        config=_config(path, text),
        size_bytes=path.stat().st_size,
    )


def builtin_model_path(name: str, flag: str) -> Path:
    """``<built-in repository>/NAME/1/model.onnx`` (the repository is built first if need be)."""
    from lumenrt.models.builtin import QUANTIZABLE, ensure_builtin_repository

    if name not in QUANTIZABLE:
        close = difflib.get_close_matches(name, QUANTIZABLE, n=1)
        hint = f" (did you mean {BUILTIN_PREFIX}{close[0]}?)" if close else ""
        raise UsageError(
            f"{flag} {BUILTIN_PREFIX}{name}: not a built-in ONNX model with data to quantize "
            f"(those are: {', '.join(QUANTIZABLE)}){hint}"
        )
    return ensure_builtin_repository() / name / "1" / "model.onnx"


def preferred_batch(source: ModelSource, requested: int | None) -> int:
    """The batch the throughput is measured at besides 1: ``--batch``, else the config's largest
    ``preferred_batch_size``, else its ``max_batch_size``, else ``DEFAULT_BATCH``; a model whose
    inputs fix their first dimension runs at that size only."""
    fixed = source.fixed_batch
    if fixed is not None:
        if requested is not None and requested != fixed:
            raise UsageError(f"--batch {requested}: the model's inputs fix the batch at {fixed}")
        return fixed
    if requested is not None:
        if requested < 1:
            raise UsageError(f"--batch {requested}: must be >= 1")
        return requested
    config = source.config
    if (
        config is not None
        and config.dynamic_batching is not None
        and config.dynamic_batching.preferred_batch_size
    ):
        return max(config.dynamic_batching.preferred_batch_size)
    if config is not None and config.max_batch_size > 0:
        return config.max_batch_size
    return DEFAULT_BATCH


def _inputs(model: onnx.ModelProto, label: str) -> tuple[InputSpec, ...]:
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        tensor = value.type.tensor_type
        if kind != "tensor_type" or not tensor.HasField("shape") or not tensor.shape.dim:
            raise UsageError(
                f"MODEL {label}: input {value.name!r} is not a tensor with a known rank and a sample "
                "axis first (only such inputs can be calibrated and compared)"
            )
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        words = [
            str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim
        ]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        specs.append(InputSpec(value.name, dims, dtype, "[" + ", ".join(words) + "]"))
    if not specs:
        raise UsageError(f"MODEL {label}: the graph has no inputs")
    return tuple(specs)


def _op_types(graph: onnx.GraphProto) -> set[str]:
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found |= _op_types(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    found |= _op_types(sub)
    return found


def _config(path: Path, label: str) -> ModelConfig | None:
    """The model's config: beside the file, or (repository layout ``<model>/<version>/model.onnx``)
    in the model folder above the version folder."""
    from lumenrt.engine.repository import CONFIG_FILES, load_model_config

    folders = [path.parent]
    if path.parent.name.isdigit():
        folders.insert(0, path.parent.parent)
    for folder in folders:
        for name in CONFIG_FILES:
            candidate = folder / name
            if candidate.is_file():
                try:
                    return load_model_config(candidate, default_name=folder.resolve().name)
                except (ConfigError, OSError) as exc:
                    raise UsageError(f"MODEL {label}: its config: {exc}") from None
    return None
