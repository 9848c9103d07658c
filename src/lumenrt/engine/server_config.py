"""Server config: ``lumenrt.json`` / ``lumenrt.yaml``, the engine's architecture knobs.

The seed's keys keep their names and values under ``engine``::

    {"engine": {"queue_type": "mpmc", "allocator_type": "lumen_arena", "thread_count": 8, "batch_size": 1}}

and lumenrt adds ``worker_mode``, ``pin``, ``cores``, ``arena_slot_bytes``, ``arena_slots``,
``large_arena_bytes``,
``spin_us``, ``loop_spin_us``, ``lane``, ``lane_max_us``, ``lane_turn_us``, ``placement``, ``placement_strict``, ``memory_binding`` and
``host_policies``
(engine/placing.py). Every key has an effect (see the README's table); a combination without one is refused,
naming both keys: ``allocator_type: standard`` with ``worker_mode: process`` (process workers read
requests from the shared arena, so there is no per-request allocation to choose), and each entry of
``NO_EFFECT`` (e.g. ``lane_max_us`` with a ``lane`` other than ``auto``). A key counts as set when
it differs from its default, or, read from a file or overrides, when it is given at all.
Unknown keys are errors naming the key. Overrides (e.g. from command-line flags) are engine keys
applied over the file; a None value means "not given".
"""

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lumenrt.engine.config import (
    ConfigError,
    check_keys,
    read_bool,
    read_choice,
    read_config_file,
    read_int,
    read_int_list,
)

QUEUE_TYPES = ("mpmc", "spsc", "naive", "batched")
ALLOCATOR_TYPES = ("lumen_arena", "standard")  # standard: a fresh numpy allocation per request
WORKER_MODES = ("thread", "process")

# Guessed, not measured: a slot holds one request's input tensors; 1 MiB fits SqueezeNet's
# 1x3x224x224 FP32 input (602,112 bytes) and 256 slots bound the arena at 256 MiB.
DEFAULT_ARENA_SLOT_BYTES = 1 << 20
DEFAULT_ARENA_SLOTS = 256
# GPU models whose max_batch_size rows outgrow an arena slot: slots of a whole batch, up to this
# much per model (engine/runtime.py, ArenaPlan; 0: none). Guessed: 27 slots of 64 SqueezeNet images.
DEFAULT_LARGE_ARENA_BYTES = 1 << 30
MIN_ARENA_SLOT_BYTES = 64  # one cache line
# How long an idle worker and a synchronous caller poll before sleeping, and the event loop's
# inline completion polls (it never sleeps). A sleeping thread takes ~10 us to wake on the 2-core
# VM this was tuned on (and then waits for the GIL); a poll answers in well under 1 us. 50 us
# covers the gap between back-to-back requests of a closed-loop client and the compute of a small
# model; measured with `benchmarks/engine.py --scenario digits-overhead --spin-us N`. 0 = sleep at
# once.
DEFAULT_SPIN_US = 50

# top-level keys of the file; server: ingress/serve_config.py; rate_limits: ingress/rate_limit.py
SECTIONS = ("engine", "server", "rate_limits")
ENGINE_KEYS = (
    "queue_type",
    "allocator_type",
    "thread_count",
    "batch_size",
    "worker_mode",
    "pin",
    "cores",
    "arena_slot_bytes",
    "arena_slots",
    "large_arena_bytes",
    "spin_us",
    "loop_spin_us",
    "lane",
    "lane_max_us",
    "lane_turn_us",
    "batching",
    "placement",
    "placement_strict",
    "memory_binding",
    "host_policies",
)
LANES = ("queue", "inline", "auto")  # engine/lane.py
BATCHINGS = ("fixed", "adaptive")  # engine/batch_cost.py
# auto: a model whose batch-1 compute is at most this runs inline. Guessed from one
# measurement on the 2-core VM: a worker hand-off and return costs ~30-60 us there, so a model
# under ~30 us spends more time being handed over than computing.
DEFAULT_LANE_MAX_US = 30
# The most inline compute the event loop does in one of its turns (ingress/service.py,
# ``infer_inline``); the turn's further requests go to the workers. 0: one request a turn.
DEFAULT_LANE_TURN_US = 1000


# engine/placing.py; "auto": "roundrobin" when engine.thread_count is given (every model gets that
# many workers, as the architecture matrix measures), else "spread"
PLACEMENTS = ("auto", "spread", "pack", "roundrobin")  # and "node:N"
# how a pinned worker's memory reaches its node: "bind" sets its thread's policy (set_mempolicy,
# MPOL_BIND), "first_touch" relies on the pinned thread touching its pages first (engine/placing.py)
MEMORY_BINDINGS = ("bind", "first_touch")
HOST_POLICY_KEYS = ("numa-node", "cpu-cores")  # Triton's --host-policy settings


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Triton's named host policy: where the instances of a model that names it run."""

    name: str
    numa_node: int | None = None
    cpu_cores: tuple[int, ...] = ()


def read_host_policies(raw: Any, source: str) -> tuple[HostPolicy, ...]:
    """``{name: {numa-node: 0, cpu-cores: "0-3"}}`` (a cpu-cores list may be a list too)."""
    from lumenrt.placement.topology import TopologyError, parse_cpulist

    out = []
    for name, settings in check_keys(raw, None, source, "engine.host_policies").items():
        path = f"engine.host_policies.{name}"
        settings = check_keys(settings, HOST_POLICY_KEYS, source, path)
        if not settings:
            raise ConfigError(source, path, f"must set one of {', '.join(HOST_POLICY_KEYS)}")
        node = settings.get("numa-node")
        cores = settings.get("cpu-cores", [])
        if isinstance(cores, str):
            try:
                cores = list(parse_cpulist(cores, f"{path}.cpu-cores"))
            except TopologyError as exc:
                raise ConfigError(source, f"{path}.cpu-cores", str(exc)) from None
        out.append(
            HostPolicy(
                name=str(name),
                numa_node=None if node is None else read_int(node, source, f"{path}.numa-node", minimum=0),
                cpu_cores=read_int_list(cores, source, f"{path}.cpu-cores", minimum=0),
            )
        )
    return tuple(out)


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), in ascending order."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Checked engine settings. ``thread_count`` 0 and ``cores`` () are resolved at construction
    (one worker per core; the usable cores), so a built EngineConfig holds concrete values."""

    queue_type: str = "mpmc"
    allocator_type: str = "lumen_arena"
    thread_count: int = (
        0  # workers per model, placed round-robin; 0 = planned (resolved: one per core, 1 with spsc)
    )
    batch_size: int = 0  # cap on rows per batch for every model (lowers max_batch_size); 0 = no cap
    worker_mode: str = "thread"
    pin: bool = True  # pin each worker to one core of ``cores``
    cores: tuple[int, ...] = ()  # () = the cores this process may use
    arena_slot_bytes: int = DEFAULT_ARENA_SLOT_BYTES
    arena_slots: int = DEFAULT_ARENA_SLOTS
    large_arena_bytes: int = DEFAULT_LARGE_ARENA_BYTES
    spin_us: int = DEFAULT_SPIN_US  # poll this long before sleeping (workers, sync callers)
    loop_spin_us: int = 0  # the server's event loop polls this long after a request (ingress/loop_spin.py)
    lane: str = "queue"  # run small models on the ingress thread: queue | inline | auto
    lane_max_us: int = DEFAULT_LANE_MAX_US  # auto: largest batch-1 compute run inline
    lane_turn_us: int = DEFAULT_LANE_TURN_US  # inline compute per event-loop turn, then the workers
    batching: str = "adaptive"  # fixed: batches as the config says; adaptive: capped at the size cheapest per row (batch_cost.py)
    placement: str = "auto"  # spread | pack | node:N | roundrobin (see PLACEMENTS); resolved at construction
    placement_strict: bool = False  # refuse a plan that must shrink or share CPUs (placement/plan.py)
    memory_binding: str = "bind"  # bind | first_touch (MEMORY_BINDINGS)
    host_policies: tuple[HostPolicy, ...] = ()  # Triton's named host policies, for instance_group.host_policy

    def __post_init__(self) -> None:
        src = "EngineConfig"
        read_choice(self.queue_type, QUEUE_TYPES, src, "engine.queue_type")
        read_choice(self.allocator_type, ALLOCATOR_TYPES, src, "engine.allocator_type")
        read_choice(self.worker_mode, WORKER_MODES, src, "engine.worker_mode")
        read_int(self.thread_count, src, "engine.thread_count", minimum=0)
        read_int(self.batch_size, src, "engine.batch_size", minimum=0)
        read_bool(self.pin, src, "engine.pin")
        read_int(self.arena_slot_bytes, src, "engine.arena_slot_bytes", minimum=MIN_ARENA_SLOT_BYTES)
        read_int(self.arena_slots, src, "engine.arena_slots", minimum=1)
        read_int(self.large_arena_bytes, src, "engine.large_arena_bytes", minimum=0)
        read_int(self.spin_us, src, "engine.spin_us", minimum=0)
        read_int(self.loop_spin_us, src, "engine.loop_spin_us", minimum=0)
        read_choice(self.lane, LANES, src, "engine.lane")
        read_int(self.lane_max_us, src, "engine.lane_max_us", minimum=0)
        read_int(self.lane_turn_us, src, "engine.lane_turn_us", minimum=0)
        read_choice(self.batching, BATCHINGS, src, "engine.batching")
        read_bool(self.placement_strict, src, "engine.placement_strict")
        read_choice(self.memory_binding, MEMORY_BINDINGS, src, "engine.memory_binding")
        if not isinstance(self.host_policies, tuple):  # the file's form ({name: {numa-node: 0}})
            object.__setattr__(self, "host_policies", read_host_policies(self.host_policies, src))
        if not (
            isinstance(self.placement, str) and (self.placement in PLACEMENTS or _node_policy(self.placement))
        ):
            raise ConfigError(
                src,
                "engine.placement",
                f"must be one of {', '.join(PLACEMENTS)} or node:N; got {self.placement!r}",
            )
        if self.placement == "auto":
            object.__setattr__(self, "placement", "roundrobin" if self.thread_count else "spread")
        elif self.thread_count and self.placement != "roundrobin":
            raise ConfigError(
                src,
                "engine.thread_count",
                f"gives every model {self.thread_count} workers placed round-robin (placement "
                f"'roundrobin'), but placement is {self.placement!r}: with a planned placement give a "
                "model its instance_group.count, or leave placement out",
            )
        if self.allocator_type == "standard" and self.worker_mode == "process":
            raise ConfigError(
                src,
                "engine.allocator_type",
                "'standard' cannot be combined with engine.worker_mode 'process': worker processes "
                "read every request from the shared arena (lumen_arena), so there is no per-request "
                "allocation to choose; use allocator_type 'lumen_arena', or worker_mode 'thread'",
            )
        usable = usable_cores()
        cores = tuple(self.cores) or usable
        for i, core in enumerate(cores):
            read_int(core, src, f"engine.cores[{i}]", minimum=0)
            if core in cores[:i]:
                raise ConfigError(src, f"engine.cores[{i}]", f"duplicate core {core}")
            if core not in usable:
                raise ConfigError(
                    src,
                    f"engine.cores[{i}]",
                    f"core {core} is not usable by this process (usable: {list(usable)})",
                )
        object.__setattr__(self, "cores", cores)
        if self.thread_count == 0:  # spsc serves a single worker (one consumer)
            object.__setattr__(self, "thread_count", 1 if self.queue_type == "spsc" else len(cores))
        if self.queue_type == "spsc" and self.thread_count > 1:
            raise ConfigError(
                src,
                "engine.queue_type",
                f"'spsc' has a single consumer, so it serves one worker, but thread_count is "
                f"{self.thread_count}: use thread_count 1, or queue_type 'mpmc' for several workers",
            )

        check_effects(self, (f.name for f in fields(self) if getattr(self, f.name) != f.default), src)

    def host_policy(self, name: str) -> HostPolicy | None:
        return next((p for p in self.host_policies if p.name == name), None)

    @property
    def label(self) -> str:
        """Short name of the architecture, e.g. ``mpmc/lumen_arena/thread/w2``."""
        return f"{self.queue_type}/{self.allocator_type}/{self.worker_mode}/w{self.thread_count}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, for recording in benchmark result files."""
        out = asdict(self)
        out["cores"] = list(self.cores)
        if self.placement != "roundrobin":  # planned: the plan decides each model's workers
            out["thread_count"] = 0
        out["host_policies"] = {
            p.name: {
                **({"numa-node": p.numa_node} if p.numa_node is not None else {}),
                **({"cpu-cores": list(p.cpu_cores)} if p.cpu_cores else {}),
            }
            for p in self.host_policies
        }
        return out


@dataclass(frozen=True, slots=True)
class NoEffect:
    """``key`` set while ``inert(config)`` holds has no effect: refused, naming ``other`` too."""

    key: str
    other: str
    inert: Callable[[EngineConfig], bool]
    why: str


NO_EFFECT = (
    NoEffect(
        "memory_binding",
        "pin",
        lambda c: not c.pin,
        "memory is bound to the node of a worker's pinned CPUs; unpinned workers' memory is first touch",
    ),
    NoEffect(
        "memory_binding",
        "placement",
        lambda c: c.placement == "roundrobin",
        "'roundrobin' pins workers only (the placement before planning); a planned placement binds memory",
    ),
    NoEffect(
        "lane_max_us",
        "lane",
        lambda c: c.lane != "auto",
        "only lane 'auto' decides by a model's compute time",
    ),
    NoEffect(
        "lane_turn_us",
        "lane",
        lambda c: c.lane == "queue",
        "it bounds the inline lane's compute per event-loop turn, and lane 'queue' runs nothing inline",
    ),
    NoEffect(
        "large_arena_bytes",
        "worker_mode",
        lambda c: c.worker_mode == "process",
        "the large arena holds GPU batches in the thread pool; worker processes use the shared arena's slots",
    ),
    NoEffect(
        "large_arena_bytes",
        "allocator_type",
        lambda c: c.allocator_type == "standard",
        "allocator_type 'standard' allocates every request afresh: no arena",
    ),
    NoEffect(
        "arena_slot_bytes",
        "allocator_type",
        lambda c: c.allocator_type == "standard" and c.worker_mode == "thread",
        "allocator_type 'standard' allocates every request afresh: no arena",
    ),
    NoEffect(
        "arena_slots",
        "allocator_type",
        lambda c: c.allocator_type == "standard" and c.worker_mode == "thread",
        "allocator_type 'standard' allocates every request afresh: no arena",
    ),
)


def check_effects(config: EngineConfig, keys_set: Iterable[str], source: str) -> None:
    """ConfigError for the first key of ``keys_set`` that has no effect beside another key's value."""
    given = set(keys_set)
    for rule in NO_EFFECT:
        if rule.key in given and rule.inert(config):
            other = getattr(config, rule.other)
            raise ConfigError(
                source,
                f"engine.{rule.key}",
                f"has no effect with engine.{rule.other} {other!r}: {rule.why}; "
                f"remove engine.{rule.key}, or change engine.{rule.other}",
            )


def _node_policy(text: str) -> bool:
    return text.startswith("node:") and text[5:].isdigit()


def load_engine_config(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> EngineConfig:
    """The engine config from ``path`` (lumenrt.json / .yaml; None: defaults only), with
    ``overrides`` (engine keys; None values ignored) applied over it; ``defaults`` replace the
    built-in defaults of the keys they name (the file and the overrides still win)."""
    values: dict[str, Any] = dict(defaults or {})
    origin: dict[str, str] = dict.fromkeys(values, "<defaults>")
    if path is not None:
        raw = check_keys(read_config_file(path), SECTIONS, path, "")
        section = check_keys(raw.get("engine", {}), ENGINE_KEYS, path, "engine")
        values.update(section)
        origin.update(dict.fromkeys(section, str(path)))
    if overrides:
        given = {
            k: v
            for k, v in check_keys(overrides, ENGINE_KEYS, "<overrides>", "engine").items()
            if v is not None
        }
        values.update(given)
        origin.update(dict.fromkeys(given, "<overrides>"))
    if "host_policies" in values and not isinstance(values["host_policies"], tuple):
        values["host_policies"] = read_host_policies(values["host_policies"], origin["host_policies"])
    if values.get("placement_strict") is None:
        values.pop("placement_strict", None)
    if isinstance(values.get("cores"), list):
        values["cores"] = tuple(values["cores"])
    elif "cores" in values:
        key = "engine.cores"
        raise ConfigError(origin["cores"], key, f"must be a list of core numbers, got {values['cores']!r}")
    try:
        config = EngineConfig(**values)
        # keys given explicitly (not only those off their default): `pin: false` with
        # `memory_binding: bind` is as inert as with first_touch
        check_effects(config, (k for k, o in origin.items() if o != "<defaults>"), "")
        return config
    except ConfigError as exc:  # re-raised naming where the offending value came from
        key = exc.field.removeprefix("engine.").split("[")[0]
        source = origin.get(key, str(path) if path is not None else "<defaults>")
        raise ConfigError(source, exc.field, exc.problem) from None
