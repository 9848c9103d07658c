"""ONNX Runtime backend: one ``InferenceSession`` per model instance, on the CPU provider (GPU
instances: on the CUDA provider, backends/onnxruntime_cuda.py).

Threads come from the placement, never from ONNX Runtime's defaults (which size the intra-op pool
to every core of the machine): ``intra_op_num_threads = placement.intra_op_threads`` and
``inter_op_num_threads = placement.inter_op_threads``, so that the threads of all workers together
never exceed the cores given to the server. Spinning of ORT's own pools is off by default: on a
2-core machine a spinning pool burns the core another worker needs. Other session options can be
set per model under ``parameters.onnxruntime`` (see ``SESSION_OPTIONS``).

``run`` feeds the arrays as they are when their dtype and layout already match the model (no copy)
and returns the outputs keyed by name. ``session.run`` releases the GIL while it computes.

``bind(shapes)`` gives a ``BoundRun`` for one fixed set of input shapes (the inline lane's batch of
one): input and output arrays allocated once and bound to the session (ONNX Runtime's IO binding),
so that a run allocates no output arrays and converts no feeds (digits_mlp: 27 heap allocations
per run against 61, measured with benchmarks/alloc_counter.c). Only where every output's shape is
known from the inputs' (static dims, and the batch dim when the model has one).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from lumenrt.backends.base import Array, Placement, register
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec

OPTIONS_FIELD = "parameters.onnxruntime"

# ONNX element type -> KServe V2 datatype name (BF16 has no numpy dtype: see protocols/dtypes.py)
ONNX_TO_V2: dict[int, str] = {
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.STRING: "BYTES",
}

# ONNX Runtime's type strings (NodeArg.type) -> the numpy dtype a feed must have
ORT_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(string)": np.dtype(np.object_),
}

_OPTIMIZATION_LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_EXECUTION_MODES: dict[str, ort.ExecutionMode] = {
    "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
    "parallel": ort.ExecutionMode.ORT_PARALLEL,
}
_TRUE = frozenset({True, "1", "true", "True", "yes"})
_FALSE = frozenset({False, "0", "false", "False", "no"})


def _as_bool(value: Any, field_path: str, source: str) -> bool:
    # True == 1 and False == 0 as set members, so the ints 1 and 0 match too; strings as Triton writes them
    if isinstance(value, bool | int | str) and value in _TRUE:
        return True
    if isinstance(value, bool | int | str) and value in _FALSE:
        return False
    raise ConfigError(source, field_path, f"must be true or false, got {value!r}")


def _as_choice(value: Any, choices: Mapping[str, Any], field_path: str, source: str) -> Any:
    if isinstance(value, str) and value.lower() in choices:
        return choices[value.lower()]
    raise ConfigError(source, field_path, f"must be one of {', '.join(choices)}, got {value!r}")


def _set_optimization(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    so.graph_optimization_level = _as_choice(value, _OPTIMIZATION_LEVELS, field_path, source)


def _set_execution_mode(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    so.execution_mode = _as_choice(value, _EXECUTION_MODES, field_path, source)


def _set_cpu_mem_arena(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    so.enable_cpu_mem_arena = _as_bool(value, field_path, source)


def _set_mem_pattern(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    so.enable_mem_pattern = _as_bool(value, field_path, source)


def _set_mem_reuse(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    so.enable_mem_reuse = _as_bool(value, field_path, source)


def _set_intra_spinning(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    flag = "1" if _as_bool(value, field_path, source) else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", flag)


def _set_inter_spinning(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    flag = "1" if _as_bool(value, field_path, source) else "0"
    so.add_session_config_entry("session.inter_op.allow_spinning", flag)


def _set_log_severity(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 4:
        raise ConfigError(source, field_path, f"must be an integer 0 (verbose) to 4 (fatal), got {value!r}")
    so.log_severity_level = value


def _set_config_entries(so: ort.SessionOptions, value: Any, field_path: str, source: str) -> None:
    """Raw ORT session config entries (``onnxruntime_session_options_config_keys.h``), for what
    has no named option here."""
    if not isinstance(value, Mapping):
        raise ConfigError(source, field_path, f"must be a mapping of string keys to values, got {value!r}")
    for key, entry in value.items():
        if not isinstance(key, str) or not isinstance(entry, str | int | float | bool):
            raise ConfigError(source, f"{field_path}.{key}", f"must be a scalar, got {entry!r}")
        text = ("1" if entry else "0") if isinstance(entry, bool) else str(entry)
        so.add_session_config_entry(key, text)


_OptionSetter = Callable[[ort.SessionOptions, Any, str, str], None]

# The options a model config may set under ``parameters.onnxruntime``
SESSION_OPTIONS: dict[str, _OptionSetter] = {
    "graph_optimization_level": _set_optimization,  # disable | basic | extended | all
    "execution_mode": _set_execution_mode,  # sequential | parallel
    "enable_cpu_mem_arena": _set_cpu_mem_arena,
    "enable_mem_pattern": _set_mem_pattern,
    "enable_mem_reuse": _set_mem_reuse,
    "intra_op_spinning": _set_intra_spinning,  # session.intra_op.allow_spinning
    "inter_op_spinning": _set_inter_spinning,  # session.inter_op.allow_spinning
    "log_severity_level": _set_log_severity,
    "config_entries": _set_config_entries,
}
# Thread counts belong to the placement so that all workers together fit the cores given
_PLACEMENT_OWNED = frozenset({"intra_op_num_threads", "inter_op_num_threads"})


def pins_pool(placement: Placement) -> bool:
    """Whether a session for ``placement`` pins its intra-op pool's threads, one to a core."""
    return 2 <= placement.intra_op_threads <= len(placement.cores)


def session_options(placement: Placement, options: Any, source: str) -> ort.SessionOptions:
    """SessionOptions for one model instance: threads from ``placement``, no spinning, sequential
    execution, all graph optimizations, then the overrides in ``options``
    (``config.parameters["onnxruntime"]``). An unknown or bad option raises ConfigError naming
    ``parameters.onnxruntime.<key>``."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = placement.intra_op_threads
    so.inter_op_num_threads = placement.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning off: ORT's pool threads otherwise busy-wait for work between ops and, with one
    # worker per core on a 2-core machine, a spinning pool takes the core the other worker needs
    # (reasoned from the thread-per-core design, not measured here; with intra_op_threads = 1
    # ORT runs on the caller's thread and there is no pool to spin).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if pins_pool(placement):
        # The pool's threads (all but the caller's) one to a planned core each, in the order the
        # plan gave them: the caller (the worker) keeps cores[0] (engine/placing.py narrows it there
        # once the session exists). ONNX Runtime numbers processors from 1 (checked here: "2" ran
        # the thread on CPU 1).
        so.add_session_config_entry(
            "session.intra_op_thread_affinities",
            ";".join(str(c + 1) for c in placement.cores[1 : placement.intra_op_threads]),
        )
    if options is None:
        return so
    if not isinstance(options, Mapping):
        raise ConfigError(source, OPTIONS_FIELD, f"must be a mapping of option names, got {options!r}")
    for key, value in options.items():
        field_path = f"{OPTIONS_FIELD}.{key}"
        if key in _PLACEMENT_OWNED:
            raise ConfigError(
                source,
                field_path,
                "thread counts come from the placement (instance_group and the server's cores), "
                "so that all workers together never use more threads than cores",
            )
        setter = SESSION_OPTIONS.get(key)
        if setter is None:
            known = ", ".join(sorted(SESSION_OPTIONS))
            raise ConfigError(source, field_path, f"unknown option (known: {known})")
        setter(so, value, field_path, source)
    return so


def create_session(model: Path | bytes, config: ModelConfig, placement: Placement) -> ort.InferenceSession:
    """An InferenceSession on the CPU provider with :func:`session_options`."""
    source = config.source or (str(model) if isinstance(model, Path) else config.name)
    so = session_options(placement, config.parameters.get("onnxruntime"), source)
    target = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(target, sess_options=so, providers=["CPUExecutionProvider"])


@dataclass(slots=True)
class OnnxRuntimeSession:
    """One model instance. Owns ``session``; ``close`` drops it (ORT frees it with the object)."""

    session: ort.InferenceSession | None
    feeds: tuple[tuple[str, np.dtype[Any]], ...]  # input name and the dtype the model takes
    output_names: list[str]
    # The session's compiled core (``InferenceSession._sess.run``), or None: the public ``run``
    # checks, per call, the feed's names against the model (done here: ``feeds``), graph capture
    # and device ownership (CPU only here), ~3 us of a ~10 us digits_mlp call. ORT's own code
    # keeps ``_sess`` as the pybind session; if a release drops it, the public run is used.
    core: Any = None
    pool_pinned: bool = False  # its pool's threads are pinned to placement.cores[1:] (pins_pool)

    def __post_init__(self) -> None:
        inner = getattr(self.session, "_sess", None)
        if self.core is None and inner is not None and callable(getattr(inner, "run", None)):
            self.core = inner.run

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        session = self.session
        if session is None:
            raise RuntimeError("onnxruntime session used after close()")
        try:
            # ascontiguousarray returns the array itself when dtype and layout already match
            feed = {name: np.ascontiguousarray(inputs[name], dtype=dtype) for name, dtype in self.feeds}
        except KeyError as exc:
            raise ValueError(f"missing input {exc.args[0]!r} (model inputs: {self._input_names()})") from None
        core = self.core
        results = (
            core(self.output_names, feed, None) if core is not None else session.run(self.output_names, feed)
        )
        return dict(zip(self.output_names, results, strict=True))

    def close(self) -> None:
        self.session = None
        self.core = None

    def bind(self, shapes: Mapping[str, tuple[int, ...]], rows: int | None) -> "BoundRun | None":
        """A run bound to arrays of exactly these input shapes (see the top), or None where the
        outputs' shapes are not fixed by them. ``rows``: the batch dim's size, when the model's
        first dim is its batch (the outputs' first dim then too)."""
        session = self.session
        if session is None or set(shapes) != {name for name, _ in self.feeds}:
            return None
        declared = {arg.name: arg for arg in session.get_outputs()}
        outputs: dict[str, Array] = {}
        for name in self.output_names:
            arg = declared[name]
            dims = list(arg.shape)
            if rows is not None and dims and not isinstance(dims[0], int):
                dims[0] = rows
            dtype = ORT_TO_NUMPY.get(arg.type)
            if dtype is None or dtype.hasobject or not all(isinstance(d, int) and d >= 0 for d in dims):
                return None
            outputs[name] = np.zeros(tuple(dims), dtype)
        inputs = {name: np.zeros(shapes[name], dtype) for name, dtype in self.feeds}
        return BoundRun(session, inputs, outputs)

    def _input_names(self) -> str:
        return ", ".join(name for name, _ in self.feeds)


class BoundRun:
    """A session bound to its own input and output arrays (``OnnxRuntimeSession.bind``): write
    the inputs into ``inputs``, call, read ``outputs``; the same arrays every run, so an answer
    read from them is valid until the next run. One caller at a time."""

    __slots__ = ("_binding", "_keep", "_options", "_run", "inputs", "outputs")

    def __init__(
        self, session: ort.InferenceSession, inputs: dict[str, Array], outputs: dict[str, Array]
    ) -> None:
        self.inputs, self.outputs = inputs, outputs
        binding = session.io_binding()
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in inputs.values()]  # views: no copy
        for name, value in zip(inputs, values, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name, a in outputs.items():
            binding.bind_output(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        self._keep = values  # the OrtValues the binding reads (their arrays are ``inputs``)
        self._options = ort.RunOptions()
        inner = getattr(binding, "_iobinding", None)
        core = getattr(getattr(session, "_sess", None), "run_with_iobinding", None)
        if inner is not None and callable(core):  # the compiled call, as OnnxRuntimeSession.core
            self._binding, self._run = inner, core
        else:
            self._binding, self._run = binding, session.run_with_iobinding

    def __call__(self) -> dict[str, Array]:
        self._run(self._binding, self._options)
        return self.outputs


class OnnxRuntimeBackend:
    name = "onnxruntime"
    model_files: tuple[str, ...] = ("model.onnx",)

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """Inputs and outputs read from the ONNX graph (weights stored outside are not read);
        symbolic or unknown dims become -1; the batch dim is left out when max_batch_size > 0."""
        model = onnx.load(str(model_path), load_external_data=False)
        initializers = {init.name for init in model.graph.initializer}
        strip_batch = config.max_batch_size > 0
        inputs = tuple(
            _tensor_spec(value, model_path, "input", strip_batch)
            for value in model.graph.input
            if value.name not in initializers  # IR < 4 lists weights among the inputs
        )
        outputs = tuple(
            _tensor_spec(value, model_path, "output", strip_batch) for value in model.graph.output
        )
        return inputs, outputs

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> OnnxRuntimeSession:
        session = create_session(model_path, config, placement)
        source = config.source or str(model_path)
        feeds = tuple((arg.name, _feed_dtype(arg.name, arg.type, source)) for arg in session.get_inputs())
        model_outputs = [arg.name for arg in session.get_outputs()]
        output_names = select_outputs(model_outputs, config.outputs, source)
        return OnnxRuntimeSession(
            session=session, feeds=feeds, output_names=output_names, pool_pinned=pins_pool(placement)
        )

    def check_gpu(self, config: ModelConfig) -> None:
        """GPU instances need onnxruntime-gpu's CUDA provider (backends/onnxruntime_cuda.py)."""
        from lumenrt.backends.onnxruntime_cuda import check_cuda_provider

        check_cuda_provider(config)

    def load_gpu(self, model_path: Path, config: ModelConfig, device: Any, stream: Any) -> Any:
        """A GPU instance's program: a session on the CUDA provider, on the instance's stream."""
        from lumenrt.backends.onnxruntime_cuda import OrtCudaProgram, stream_handle

        # one intra-op thread: the CPU provider only runs the nodes CUDA lacks, on the worker's thread
        so = session_options(
            Placement(cores=(), intra_op_threads=1), config.parameters.get("onnxruntime"), config.source
        )
        return OrtCudaProgram(model_path, config, so, device.index, stream_handle(stream))


def select_outputs(model_outputs: Sequence[str], wanted: Sequence[TensorSpec], source: str) -> list[str]:
    """The outputs to fetch: those the config lists (a subset is fine), else all of the model's."""
    if not wanted:
        return list(model_outputs)
    for index, spec in enumerate(wanted):
        if spec.name not in model_outputs:
            raise ConfigError(
                source,
                f"outputs[{index}].name",
                f"the model has no output {spec.name!r} (it has: {', '.join(model_outputs)})",
            )
    return [spec.name for spec in wanted]


def _feed_dtype(name: str, ort_type: str, source: str) -> np.dtype[Any]:
    try:
        return ORT_TO_NUMPY[ort_type]
    except KeyError:
        raise ConfigError(
            source, "inputs", f"model input {name!r} has type {ort_type}, not supported"
        ) from None


def _tensor_spec(value: onnx.ValueInfoProto, model_path: Path, kind: str, strip_batch: bool) -> TensorSpec:
    where = f"{kind}s"
    type_proto = value.type
    if type_proto.WhichOneof("value") != "tensor_type":
        raise ConfigError(
            model_path,
            where,
            f"model {kind} {value.name!r} is not a tensor (a map or sequence): list the {kind}s in the config",
        )
    tensor = type_proto.tensor_type
    datatype = ONNX_TO_V2.get(tensor.elem_type)
    if datatype is None:
        type_name = onnx.TensorProto.DataType.Name(tensor.elem_type)
        raise ConfigError(
            model_path, where, f"model {kind} {value.name!r} has element type {type_name}, not supported"
        )
    if not tensor.HasField("shape"):
        raise ConfigError(
            model_path,
            where,
            f"model {kind} {value.name!r} has no known rank: list the {kind}s in the config",
        )
    dims = tuple(dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim)
    if strip_batch:
        if not dims:
            raise ConfigError(
                model_path,
                "max_batch_size",
                f"is > 0 but model {kind} {value.name!r} is a scalar (no batch dimension)",
            )
        dims = dims[1:]
    return TensorSpec(name=value.name, datatype=datatype, dims=dims)


register(OnnxRuntimeBackend())
