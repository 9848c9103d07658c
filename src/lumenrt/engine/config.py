"""Model configuration: the typed form of ``<repo>/<model>/config.yaml`` (or ``.json``).

Field names follow Triton's model configuration where one exists (``max_batch_size``,
``dynamic_batching.preferred_batch_size``, ``max_queue_delay_us`` ...) so that a Triton user reads
them at sight. Datatypes are KServe V2 names (FP32, INT64, BYTES ...). ``dims`` exclude the batch
dimension when ``max_batch_size > 0``; -1 marks a variable dimension.

``model_config_from_dict`` checks one parsed file (``read_config_file``); the repository's
``load_model_config`` does both and checks the backend name against the registry (this module
imports no backend: the backends import it). Unknown keys are refused (a typo must not pass
silently), and every error names the file and the dotted field path, e.g.
``input[1].dims[0]``. The checked readers at the bottom are shared with ``server_config``.

Instances: Triton's ``instance_group``, one KIND_CPU group (``instance_group``, None when only
KIND_GPU groups are listed) and any number of KIND_GPU groups (``gpu_groups``); ``optimization``
holds how GPU instances run (``GpuOptions``, engine/gpu/) and is refused for a model without any.
"""

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]

from lumenrt.protocols import dtypes


class ConfigError(ValueError):
    """A configuration that cannot be used. The message names the file and the field:
    ``models/digits/config.yaml: dynamic_batching.max_queue_delay_us: must be >= 0, got -5``."""

    def __init__(self, source: Path | str, field_path: str, problem: str) -> None:
        self.source = str(source)
        self.field = field_path
        self.problem = problem
        super().__init__(f"{source}: {field_path}: {problem}" if field_path else f"{source}: {problem}")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # KServe V2 name: BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BYTES
    dims: tuple[int, ...]  # without the batch dimension when max_batch_size > 0; -1 = variable


TIMEOUT_ACTIONS = ("REJECT", "DELAY")


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy, for one priority level (or every level: the default)."""

    max_queue_size: int = 1024  # requests waiting at this level; beyond it: rejected at once
    default_timeout_us: int = 0  # Triton's default_timeout_microseconds; 0 = none unless the request sets one
    allow_timeout_override: bool = True  # False: a request's own timeout is ignored
    timeout_action: str = "REJECT"  # REJECT: answered at its deadline; DELAY: runs after the on-time ones


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    max_queue_size: int = 1024  # the default policy's: requests waiting; beyond it: rejected at once
    default_timeout_us: int = 0  # the default policy's: 0 = no deadline unless the request sets one
    priority_levels: int = 0  # 0 or 1: one queue; N: levels 1 (first served) .. N
    default_priority_level: int = 0  # the level of a request that names none (0: the lowest, N)
    default_queue_policy: QueuePolicy | None = None  # None: max_queue_size and default_timeout_us
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()  # (level, policy) overrides

    @property
    def levels(self) -> int:
        return max(self.priority_levels, 1)

    def policy(self, level: int) -> QueuePolicy:
        """The queue policy of priority ``level`` (1 .. levels)."""
        for lv, pol in self.priority_queue_policy:
            if lv == level:
                return pol
        if self.default_queue_policy is not None:
            return self.default_queue_policy
        return QueuePolicy(self.max_queue_size, self.default_timeout_us)

    def level_of(self, priority: int) -> int:
        """A request's level: its ``priority`` (1 .. levels; 0 = the default level)."""
        if priority == 0:
            return self.default_priority_level or self.levels
        return priority


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """The model's CPU instances (Triton's ``kind: KIND_CPU``, or ``KIND_AUTO``)."""

    count: int = 0  # model instances (one per worker); 0 = one per core given to the model
    cores: tuple[int, ...] = ()  # cores to pin instances to; () = the server's cores
    numa_node: int | None = None  # keep the instances (threads and memory) on this node
    host_policy: str = ""  # Triton's: a named engine.host_policies entry (numa_node / cpu_cores)


@dataclass(frozen=True, slots=True)
class GpuGroup:
    """Triton's ``kind: KIND_GPU`` group: ``count`` instances on each device of ``gpus``. Each
    instance is one worker thread of the engine bound to its device (engine/gpu/)."""

    count: int = 1
    gpus: tuple[int, ...] = (0,)  # CUDA device indices, as the process sees them (CUDA_VISIBLE_DEVICES)


GPU_AUTOCAST = ("FP16", "BF16")  # optimization.cuda.autocast (FP32: none)


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """How a model's GPU instances run (``optimization``, read only with KIND_GPU groups). Triton's
    names where Triton has the switch; lumenrt's own are marked."""

    accelerator: str = (
        ""  # execution_accelerators.gpu_execution_accelerator: "" or "cuda" (ONNX Runtime's CUDA EP)
    )
    graphs: bool = False  # cuda.graphs: CUDA graphs captured at load for the preferred batch sizes
    autocast: str = ""  # cuda.autocast (lumenrt's): "" (FP32), FP16 or BF16; PyTorch models only
    copy_streams: bool = (
        True  # cuda.copy_streams (lumenrt's): copies on streams of their own; False: one stream
    )
    busy_wait_events: bool = (
        False  # cuda.busy_wait_events: the worker spins on its batch's event, never sleeps
    )
    # cuda.direct_copies (lumenrt's): each request's input rows go to the device from where
    # admission put them (its arena slot, registered page-locked), with no gather into staging
    direct_copies: bool = False
    pinned_input: bool = True  # input_pinned_memory.enable: page-locked input staging (else pageable)
    pinned_output: bool = True  # output_pinned_memory.enable


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    backend: str  # a key of lumenrt.backends.REGISTRY: onnxruntime, xgboost, pytorch, python
    max_batch_size: int = 0  # 0 = the model takes no batch dimension
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    dynamic_batching: DynamicBatching | None = None  # None = every request runs alone
    # the CPU instances; None when instance_group lists only KIND_GPU groups
    instance_group: InstanceGroup | None = field(default_factory=InstanceGroup)
    gpu_groups: tuple[GpuGroup, ...] = ()  # KIND_GPU groups, in the order given
    gpu: GpuOptions = field(default_factory=GpuOptions)  # ``optimization``: how GPU instances run
    parameters: Mapping[str, Any] = field(default_factory=dict)  # backend options
    warmup: int = 0  # inference runs on zeros at load, per instance
    version_policy: str = "latest"  # "latest" | "all" | "specific"
    versions: tuple[int, ...] = ()  # with version_policy "specific"
    response_cache: bool = False  # Triton's response_cache.enable: answers kept within the server's budget
    source: str = ""  # the config file this came from (for error messages)

    @property
    def gpu_devices(self) -> tuple[int, ...]:
        """The device of each GPU instance: ``count`` per listed GPU, group by group."""
        return tuple(gpu for g in self.gpu_groups for gpu in g.gpus for _ in range(g.count))


# --- loading a model config ------------------------------------------------------------------------

_MODEL_KEYS = (
    "name",
    "backend",
    "max_batch_size",
    "input",
    "inputs",
    "output",
    "outputs",
    "dynamic_batching",
    "instance_group",
    "parameters",
    "warmup",
    "version_policy",
    "response_cache",
    "optimization",
)
_TENSOR_KEYS = ("name", "datatype", "data_type", "dims")  # data_type: Triton's spelling
_BATCHING_KEYS = (
    "preferred_batch_size",
    "max_queue_delay_us",
    "max_queue_size",
    "default_timeout_us",
    "priority_levels",
    "default_priority_level",
    "default_queue_policy",
    "priority_queue_policy",
)
_POLICY_KEYS = ("max_queue_size", "default_timeout_microseconds", "allow_timeout_override", "timeout_action")
MAX_PRIORITY_LEVELS = 16  # guessed: more levels than any scheduling scheme here needs; each is a ring
_INSTANCE_KEYS = ("count", "cores", "kind", "numa_node", "host_policy", "gpus")
_INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")  # Triton's; KIND_AUTO is KIND_CPU here
_CPU_ONLY_KEYS = ("cores", "numa_node", "host_policy")
_OPTIMIZATION_KEYS = ("execution_accelerators", "cuda", "input_pinned_memory", "output_pinned_memory")
_CUDA_KEYS = ("graphs", "autocast", "copy_streams", "busy_wait_events", "direct_copies")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")  # safe in a URL path and as a folder name


def model_config_from_dict(raw: Mapping[str, Any], source: str, default_name: str) -> ModelConfig:
    """Check an already parsed config; ``source`` names it in errors (usually the file path).

    ``backend`` is only checked to be a name here: whether a backend of that name is registered is
    checked where configs are loaded (``lumenrt.engine.repository.load_model_config``), since the
    backends import this module."""
    raw = check_keys(raw, _MODEL_KEYS, source, "")
    name = default_name
    if "name" in raw:
        name = read_str(raw["name"], source, "name")
        if name != default_name:
            raise ConfigError(
                source,
                "name",
                f"{name!r} differs from the model folder name {default_name!r} (they must match)",
            )
    if not _MODEL_NAME.fullmatch(name):
        raise ConfigError(
            source,
            "name",
            f"model name {name!r} must be letters, digits, '_', '.' or '-', not starting with '_', '.' or '-'",
        )
    if "backend" not in raw:
        raise ConfigError(source, "backend", "required: the backend that runs the model (e.g. onnxruntime)")
    backend = read_str(raw["backend"], source, "backend")
    max_batch_size = read_int(raw.get("max_batch_size", 0), source, "max_batch_size", minimum=0)
    batching = None
    if "dynamic_batching" in raw:
        if max_batch_size == 0:
            raise ConfigError(
                source,
                "dynamic_batching",
                "needs max_batch_size > 0 (a model without a batch dimension is not batched)",
            )
        batching = _dynamic_batching(raw["dynamic_batching"], source, max_batch_size)
    policy, versions = _version_policy(raw.get("version_policy", "latest"), source)
    cpu_group, gpu_groups = _instance_groups(raw.get("instance_group", {}), source)
    gpu = GpuOptions()
    if "optimization" in raw:
        if not gpu_groups:
            raise ConfigError(
                source,
                "optimization",
                "applies to KIND_GPU instances only, and instance_group lists none",
            )
        gpu = _optimization(raw["optimization"], source, backend)
    return ModelConfig(
        name=name,
        backend=backend,
        max_batch_size=max_batch_size,
        inputs=_tensors(raw, ("input", "inputs"), source),
        outputs=_tensors(raw, ("output", "outputs"), source),
        dynamic_batching=batching,
        instance_group=cpu_group,
        gpu_groups=gpu_groups,
        gpu=gpu,
        parameters=dict(check_keys(raw.get("parameters", {}), None, source, "parameters")),
        warmup=read_int(raw.get("warmup", 0), source, "warmup", minimum=0),
        version_policy=policy,
        versions=versions,
        response_cache=_response_cache(raw.get("response_cache", {}), source),
        source=source,
    )


def _tensors(raw: Mapping[str, Any], keys: tuple[str, str], source: str) -> tuple[TensorSpec, ...]:
    given = [k for k in keys if k in raw]
    if len(given) == 2:
        raise ConfigError(source, keys[1], f"given both as {keys[0]!r} and {keys[1]!r}: keep one")
    if not given:
        return ()
    key = given[0]
    items = raw[key]
    if not isinstance(items, list):
        raise ConfigError(source, key, f"must be a list of tensors, got {_show(items)}")
    specs: list[TensorSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        path = f"{key}[{i}]"
        spec = _tensor(item, source, path)
        if spec.name in seen:
            raise ConfigError(
                source, f"{path}.name", f"duplicate tensor name {spec.name!r} (also {key}[{seen[spec.name]}])"
            )
        seen[spec.name] = i
        specs.append(spec)
    return tuple(specs)


def _tensor(raw: Any, source: str, path: str) -> TensorSpec:
    raw = check_keys(raw, _TENSOR_KEYS, source, path)
    for required in ("name", "dims"):
        if required not in raw:
            raise ConfigError(source, f"{path}.{required}", "required")
    name = read_str(raw["name"], source, f"{path}.name")
    type_keys = [k for k in ("datatype", "data_type") if k in raw]
    if not type_keys:
        raise ConfigError(
            source, f"{path}.datatype", "required (a KServe V2 name such as FP32, INT64, BYTES)"
        )
    if len(type_keys) == 2:
        raise ConfigError(source, f"{path}.data_type", "given both as 'datatype' and 'data_type': keep one")
    type_path = f"{path}.{type_keys[0]}"
    try:
        datatype = dtypes.normalize(read_str(raw[type_keys[0]], source, type_path))
    except ValueError as exc:
        raise ConfigError(source, type_path, str(exc)) from None
    dims_path = f"{path}.dims"
    dims = raw["dims"]
    if not isinstance(dims, list):
        raise ConfigError(
            source, dims_path, f"must be a list of sizes (> 0, or -1 for variable), got {_show(dims)}"
        )
    for j, d in enumerate(dims):
        if isinstance(d, bool) or not isinstance(d, int) or (d < 1 and d != -1):
            raise ConfigError(
                source, f"{dims_path}[{j}]", f"must be a size > 0, or -1 for variable, got {_show(d)}"
            )
    return TensorSpec(name=name, datatype=datatype, dims=tuple(dims))


def _dynamic_batching(raw: Any, source: str, max_batch_size: int) -> DynamicBatching:
    raw = check_keys(raw, _BATCHING_KEYS, source, "dynamic_batching")
    defaults = DynamicBatching()
    path = "dynamic_batching.preferred_batch_size"
    preferred = read_int_list(raw.get("preferred_batch_size", []), source, path, minimum=1)
    for i, size in enumerate(preferred):
        if size > max_batch_size:
            raise ConfigError(
                source, f"{path}[{i}]", f"must be <= max_batch_size ({max_batch_size}), got {size}"
            )
    delay_us = read_int(
        raw.get("max_queue_delay_us", defaults.max_queue_delay_us),
        source,
        "dynamic_batching.max_queue_delay_us",
        minimum=0,
    )
    # the shortcuts max_queue_size / default_timeout_us, or Triton's default_queue_policy (not both)
    shortcut = QueuePolicy(
        max_queue_size=read_int(
            raw.get("max_queue_size", defaults.max_queue_size),
            source,
            "dynamic_batching.max_queue_size",
            minimum=1,
        ),
        default_timeout_us=read_int(
            raw.get("default_timeout_us", defaults.default_timeout_us),
            source,
            "dynamic_batching.default_timeout_us",
            minimum=0,
        ),
    )
    default_policy = shortcut
    explicit: QueuePolicy | None = None
    if "default_queue_policy" in raw:
        for key in ("max_queue_size", "default_timeout_us"):
            if key in raw:
                raise ConfigError(
                    source,
                    f"dynamic_batching.{key}",
                    "give it inside default_queue_policy (as Triton names it), not beside it",
                )
        default_policy = explicit = _queue_policy(
            raw["default_queue_policy"], source, "dynamic_batching.default_queue_policy"
        )
    levels = read_int(
        raw.get("priority_levels", 0),
        source,
        "dynamic_batching.priority_levels",
        minimum=0,
        maximum=MAX_PRIORITY_LEVELS,
    )
    default_level = read_int(
        raw.get("default_priority_level", 0),
        source,
        "dynamic_batching.default_priority_level",
        minimum=0,
        maximum=max(levels, 0),
    )
    per_level: list[tuple[int, QueuePolicy]] = []
    raw_levels = raw.get("priority_queue_policy", {})
    if not isinstance(raw_levels, Mapping):
        raise ConfigError(
            source,
            "dynamic_batching.priority_queue_policy",
            f"must be a mapping of level: policy, got {_show(raw_levels)}",
        )
    for key, value in raw_levels.items():
        path = f"dynamic_batching.priority_queue_policy.{key}"
        level = int(key) if isinstance(key, int) or (isinstance(key, str) and key.isdigit()) else -1
        if not 1 <= level <= max(levels, 1) or isinstance(key, bool):
            raise ConfigError(
                source, path, f"a priority level must be 1 .. priority_levels ({levels}), got {_show(key)}"
            )
        per_level.append((level, _queue_policy(value, source, path)))
    return DynamicBatching(
        preferred_batch_size=preferred,
        max_queue_delay_us=delay_us,
        max_queue_size=default_policy.max_queue_size,
        default_timeout_us=default_policy.default_timeout_us,
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=explicit,
        priority_queue_policy=tuple(sorted(per_level)),
    )


def _queue_policy(raw: Any, source: str, path: str) -> QueuePolicy:
    raw = check_keys(raw, _POLICY_KEYS, source, path)
    defaults = QueuePolicy()
    return QueuePolicy(
        max_queue_size=read_int(
            raw.get("max_queue_size", defaults.max_queue_size), source, f"{path}.max_queue_size", minimum=1
        ),
        default_timeout_us=read_int(
            raw.get("default_timeout_microseconds", 0),
            source,
            f"{path}.default_timeout_microseconds",
            minimum=0,
        ),
        allow_timeout_override=read_bool(
            raw.get("allow_timeout_override", True), source, f"{path}.allow_timeout_override"
        ),
        timeout_action=read_choice(
            raw.get("timeout_action", "REJECT"), TIMEOUT_ACTIONS, source, f"{path}.timeout_action"
        ),
    )


def _response_cache(raw: Any, source: str) -> bool:
    """Triton's ``response_cache: {enable: true}``; off when absent."""
    raw = check_keys(raw, ("enable",), source, "response_cache")
    return read_bool(raw.get("enable", False), source, "response_cache.enable")


def _instance_groups(raw: Any, source: str) -> tuple[InstanceGroup | None, tuple[GpuGroup, ...]]:
    """The CPU group (at most one; None when only KIND_GPU groups are listed) and the GPU groups.
    Triton's list form ``[{kind: KIND_GPU, count: 1, gpus: [0]}, {kind: KIND_CPU, count: 2}]`` or
    one group as a mapping."""
    if not isinstance(raw, list):  # one group: {count: 2} (a CPU group unless its kind says)
        group = _instance_group(raw, source, "instance_group")
        return (group, ()) if isinstance(group, InstanceGroup) else (None, (group,))
    if not raw:
        raise ConfigError(source, "instance_group", "lists no group (leave it out for the default)")
    cpu: InstanceGroup | None = None
    cpu_at = -1
    gpus: list[GpuGroup] = []
    for i, item in enumerate(raw):
        group = _instance_group(item, source, f"instance_group[{i}]")
        if isinstance(group, GpuGroup):
            gpus.append(group)
        elif cpu is not None:
            raise ConfigError(
                source,
                f"instance_group[{i}]",
                f"lumenrt runs one KIND_CPU instance group per model (also instance_group[{cpu_at}]): "
                "merge their counts",
            )
        else:
            cpu, cpu_at = group, i
    return cpu, tuple(gpus)


def _instance_group(raw: Any, source: str, path: str) -> InstanceGroup | GpuGroup:
    raw = check_keys(raw, _INSTANCE_KEYS, source, path)
    kind = read_choice(raw.get("kind", "KIND_CPU"), _INSTANCE_KINDS, source, f"{path}.kind")
    if kind == "KIND_GPU":
        for key in _CPU_ONLY_KEYS:
            if key in raw:
                raise ConfigError(
                    source,
                    f"{path}.{key}",
                    "only for KIND_CPU groups: a GPU instance's host thread gets a CPU of its own "
                    "from the placement plan",
                )
        gpus = read_int_list(raw.get("gpus", [0]), source, f"{path}.gpus", minimum=0)
        if not gpus:
            raise ConfigError(source, f"{path}.gpus", "must list at least one device index (default [0])")
        return GpuGroup(count=read_int(raw.get("count", 1), source, f"{path}.count", minimum=1), gpus=gpus)
    if "gpus" in raw:
        raise ConfigError(source, f"{path}.gpus", f"only for kind KIND_GPU (this group is {kind})")
    node = raw.get("numa_node")
    policy = raw.get("host_policy", "")
    if not isinstance(policy, str):
        raise ConfigError(source, f"{path}.host_policy", f"must be a host policy's name, got {_show(policy)}")
    group = InstanceGroup(
        count=read_int(raw.get("count", 0), source, f"{path}.count", minimum=0),
        cores=read_int_list(raw.get("cores", []), source, f"{path}.cores", minimum=0),
        numa_node=None if node is None else read_int(node, source, f"{path}.numa_node", minimum=0),
        host_policy=policy,
    )
    given = [k for k in _CPU_ONLY_KEYS if k in raw]
    if len(given) > 1:
        raise ConfigError(
            source, f"{path}.{given[1]}", f"give one of cores, numa_node and host_policy, not {given}"
        )
    return group


def _optimization(raw: Any, source: str, backend: str) -> GpuOptions:
    """Triton's ``optimization`` block, the parts that GPU instances read (see GpuOptions)."""
    raw = check_keys(raw, _OPTIMIZATION_KEYS, source, "optimization")
    accelerator = ""
    if "execution_accelerators" in raw:
        path = "optimization.execution_accelerators"
        accelerators = check_keys(raw["execution_accelerators"], ("gpu_execution_accelerator",), source, path)
        if "gpu_execution_accelerator" in accelerators:
            accelerator = _gpu_accelerator(
                accelerators["gpu_execution_accelerator"],
                source,
                f"{path}.gpu_execution_accelerator",
                backend,
            )
    cuda = check_keys(raw.get("cuda", {}), _CUDA_KEYS, source, "optimization.cuda")
    autocast = ""
    if "autocast" in cuda:
        path = "optimization.cuda.autocast"
        autocast = read_choice(cuda["autocast"], ("FP32", *GPU_AUTOCAST), source, path)
        autocast = "" if autocast == "FP32" else autocast
        if autocast and backend != "pytorch":
            raise ConfigError(
                source, path, f"PyTorch models only (a {backend} model runs in the precision it was saved in)"
            )
    graphs = read_bool(cuda.get("graphs", False), source, "optimization.cuda.graphs")
    if graphs and backend == "onnxruntime":
        raise ConfigError(
            source,
            "optimization.cuda.graphs",
            "lumenrt captures CUDA graphs of PyTorch models only (not ONNX Runtime's yet)",
        )
    return GpuOptions(
        accelerator=accelerator,
        graphs=graphs,
        autocast=autocast,
        copy_streams=read_bool(cuda.get("copy_streams", True), source, "optimization.cuda.copy_streams"),
        busy_wait_events=read_bool(
            cuda.get("busy_wait_events", False), source, "optimization.cuda.busy_wait_events"
        ),
        direct_copies=read_bool(cuda.get("direct_copies", False), source, "optimization.cuda.direct_copies"),
        pinned_input=_enabled(raw, "input_pinned_memory", source),
        pinned_output=_enabled(raw, "output_pinned_memory", source),
    )


def _gpu_accelerator(raw: Any, source: str, path: str, backend: str) -> str:
    """Triton's ``gpu_execution_accelerator: [{name: cuda}]``: ONNX Runtime's CUDA execution
    provider, named (KIND_GPU instances of an ONNX model use it anyway). TensorRT is refused."""
    if backend != "onnxruntime":
        raise ConfigError(
            source,
            path,
            f"only the onnxruntime backend has execution accelerators (a {backend} model's GPU "
            "instances run on CUDA through its own library)",
        )
    if not isinstance(raw, list) or len(raw) != 1:
        raise ConfigError(
            source, path, f"must be a list of one accelerator, [{{name: cuda}}], got {_show(raw)}"
        )
    entry = check_keys(raw[0], ("name", "parameters"), source, f"{path}[0]")
    name = read_str(entry.get("name"), source, f"{path}[0].name")
    if name.lower() == "tensorrt":
        raise ConfigError(
            source,
            f"{path}[0].name",
            "TensorRT is not supported by lumenrt: use [{name: cuda}] (ONNX Runtime's "
            "CUDAExecutionProvider) or leave gpu_execution_accelerator out",
        )
    if name.lower() != "cuda":
        raise ConfigError(
            source, f"{path}[0].name", f"must be cuda (the only one lumenrt runs), got {name!r}"
        )
    if entry.get("parameters"):
        raise ConfigError(source, f"{path}[0].parameters", "the cuda accelerator takes no parameters")
    return "cuda"


def _enabled(raw: Mapping[str, Any], key: str, source: str) -> bool:
    """Triton's ``{enable: true}`` switches; on when absent."""
    block = check_keys(raw.get(key, {}), ("enable",), source, f"optimization.{key}")
    return read_bool(block.get("enable", True), source, f"optimization.{key}.enable")


def _version_policy(raw: Any, source: str) -> tuple[str, tuple[int, ...]]:
    path = "version_policy"
    forms = "'latest', 'all' or {specific: [1, 3]}"
    if isinstance(raw, str):
        if raw in ("latest", "all"):
            return raw, ()
        raise ConfigError(source, path, f"must be {forms}, got {raw!r}")
    if not isinstance(raw, Mapping):
        raise ConfigError(source, path, f"must be {forms}, got {_show(raw)}")
    raw = check_keys(raw, ("specific",), source, path)
    if "specific" not in raw:
        raise ConfigError(source, path, f"must be {forms}, got an empty mapping")
    versions = raw["specific"]
    path = f"{path}.specific"
    if isinstance(versions, Mapping):  # Triton's form: {specific: {versions: [1, 3]}}
        versions = check_keys(versions, ("versions",), source, path).get("versions", [])
        path = f"{path}.versions"
    numbers = read_int_list(versions, source, path, minimum=1)
    if not numbers:
        raise ConfigError(source, path, "must list at least one version")
    return "specific", tuple(sorted(numbers))


# --- reading files ---------------------------------------------------------------------------------

_SUFFIXES = (".yaml", ".yml", ".json")
_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"


def read_config_file(path: Path) -> Mapping[str, Any]:
    """The top-level mapping of a .yaml/.yml/.json file. A key given twice is an error (YAML and
    JSON parsers otherwise keep the last one silently); an empty file is an empty mapping."""
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ConfigError(
            path, "", f"unsupported config file type {path.suffix!r} (use .yaml, .yml or .json)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "", f"cannot read: {exc}") from None
    data = _parse_json(text, path) if suffix == ".json" else _parse_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, "", f"must be a mapping of keys at the top level, got {_show(data)}")
    return data


def _parse_yaml(text: str, path: Path) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_duplicates(node, path, "", set())
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path, "", f"invalid YAML{where}: {problem}") from None
    finally:
        loader.dispose()


def _check_yaml_duplicates(node: Any, source: Path, path: str, seen_nodes: set[int]) -> None:
    if id(node) in seen_nodes:  # an alias: already checked (and possibly recursive)
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key_node.tag != _YAML_MERGE_TAG:
                line = key_node.start_mark.line + 1
                if key in lines:
                    raise ConfigError(
                        source, _join(path, key), f"given twice (lines {lines[key]} and {line})"
                    )
                lines[key] = line
            _check_yaml_duplicates(value_node, source, _join(path, key or "?"), seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_yaml_duplicates(item, source, f"{path}[{i}]", seen_nodes)


class _JsonPairs(list[tuple[str, Any]]):
    """A JSON object before its keys are checked for duplicates."""


def _parse_json(text: str, path: Path) -> Any:
    try:
        data = json.loads(text, object_pairs_hook=_JsonPairs) if text.strip() else None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            path, "", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    return _json_objects(data, path, "")


def _json_objects(value: Any, source: Path, path: str) -> Any:
    if isinstance(value, _JsonPairs):
        out: dict[str, Any] = {}
        for key, item in value:
            if key in out:
                raise ConfigError(source, _join(path, key), "given twice")
            out[key] = _json_objects(item, source, _join(path, key))
        return out
    if isinstance(value, list):
        return [_json_objects(item, source, f"{path}[{i}]") for i, item in enumerate(value)]
    return value


# --- checked readers: each names the field and shows the bad value ---------------------------------


def check_keys(raw: Any, valid: Collection[str] | None, source: Path | str, path: str) -> Mapping[str, Any]:
    """``raw`` as a mapping with string keys, all of them in ``valid`` (None: any key)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(source, path, f"must be a mapping, got {_show(raw)}")
    for key in raw:
        if not isinstance(key, str):
            raise ConfigError(source, path, f"keys must be strings, got {_show(key)}")
        if valid is not None and key not in valid:
            hint = difflib.get_close_matches(key, list(valid), n=1)
            maybe = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(
                source, _join(path, key), f"unknown key (valid: {', '.join(sorted(valid))}){maybe}"
            )
    return raw


def read_int(value: Any, source: Path | str, path: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(source, path, f"must be an integer, got {_show(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(source, path, f"must be {bounds}, got {value}")
    return value


def read_int_list(value: Any, source: Path | str, path: str, *, minimum: int) -> tuple[int, ...]:
    """A list of distinct integers >= minimum."""
    if not isinstance(value, list):
        raise ConfigError(source, path, f"must be a list of integers, got {_show(value)}")
    out = tuple(read_int(v, source, f"{path}[{i}]", minimum=minimum) for i, v in enumerate(value))
    for i, v in enumerate(out):
        if v in out[:i]:
            raise ConfigError(source, f"{path}[{i}]", f"duplicate value {v}")
    return out


def read_bool(value: Any, source: Path | str, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, path, f"must be true or false, got {_show(value)}")
    return value


def read_str(value: Any, source: Path | str, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(source, path, f"must be a non-empty string, got {_show(value)}")
    return value


def read_choice(value: Any, choices: Collection[str], source: Path | str, path: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(source, path, f"must be one of {', '.join(choices)}; got {_show(value)}")
    return value


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
