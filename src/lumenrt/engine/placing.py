"""The engine's side of placement: from the models' configs and the engine settings to the plan
(placement/plan.py, which knows nothing of configs), and from the plan to each worker's Placement.

What the settings decide:
  - ``engine.placement``: the policy (spread, pack, node:N, roundrobin); ``auto`` is roundrobin when
    ``engine.thread_count`` is given (that many workers for every model, placed as before planning:
    the architecture matrix measures exactly that) and spread otherwise;
  - ``engine.cores``: the CPUs the plan may use (default: every usable one);
  - ``engine.placement_strict``: refuse a plan that would shrink or share;
  - ``engine.host_policies``: Triton's named host policies, which a model's
    ``instance_group.host_policy`` names instead of ``numa_node`` or ``cores``;
  - ``engine.queue_type: spsc``: one worker per model (the ring has one consumer).

A model's KIND_GPU instances are workers too: one host thread each, planned as one busy thread
(placement/plan.py rule 9); their Placement carries the device (``gpu``).
"""

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace

from lumenrt.backends.base import Placement
from lumenrt.engine.config import ConfigError, ModelConfig
from lumenrt.engine.server_config import EngineConfig, usable_cores
from lumenrt.placement.memory import set_thread_memory_node
from lumenrt.placement.plan import Demand, ModelPlan, PlacementError, Plan, Policy, plan_placement
from lumenrt.placement.topology import Topology, TopologyError, flat_topology, format_cpulist, read_topology

logger = logging.getLogger(__name__)


def engine_topology(settings: EngineConfig, root: str = "/") -> Topology:
    """This machine as the engine may use it: ``engine.cores`` narrows the usable CPUs (of this
    machine: a fake tree under another ``root`` is taken as it is). Where sysfs cannot be read (a
    sandbox without it), one node of the CPUs this process may use, with a warning."""
    try:
        topo = read_topology(root)
    except TopologyError as exc:
        if str(root) != "/":
            raise
        logger.warning("placement: %s; planning on one node of CPUs %s", exc, list(usable_cores()))
        topo = flat_topology(usable_cores())
    if str(root) != "/":
        return topo
    usable = tuple(c for c in topo.usable_cpus if c in set(settings.cores))
    if not usable:
        raise PlacementError(
            f"engine.cores {list(settings.cores)}: none is usable (usable: {format_cpulist(topo.usable_cpus)})"
        )
    return replace(topo, usable_cpus=usable, busy_threads=min(topo.busy_threads, len(usable)))


def demand_for(config: ModelConfig, settings: EngineConfig) -> Demand:
    gpus = config.gpu_devices
    group = config.instance_group
    if group is None:  # KIND_GPU groups only
        if settings.queue_type == "spsc" and len(gpus) > 1:
            raise ConfigError(
                config.source or config.name,
                "instance_group",
                f"engine.queue_type spsc has one consumer per model, and {len(gpus)} GPU instances "
                "are asked: use another queue_type (mpmc) or one instance",
            )
        return Demand(config.name, gpus=gpus, cpu=False)
    if settings.queue_type == "spsc" and gpus:
        raise ConfigError(
            config.source or config.name,
            "instance_group",
            "engine.queue_type spsc has one consumer per model: a model with both CPU and GPU "
            "instances needs another queue_type (mpmc)",
        )
    cores, node = group.cores, group.numa_node
    if group.host_policy:
        policy = settings.host_policy(group.host_policy)
        if policy is None:
            known = ", ".join(p.name for p in settings.host_policies) or "none"
            raise ConfigError(
                config.name,
                "instance_group.host_policy",
                f"no host policy {group.host_policy!r} in engine.host_policies (defined: {known})",
            )
        cores, node = policy.cpu_cores, policy.numa_node
    count = group.count
    if settings.queue_type == "spsc":
        count = 1
    elif settings.placement == "roundrobin" and not count:
        count = settings.thread_count
    return Demand(config.name, count=count, cores=cores, node=node, gpus=gpus)


def plan_engine(
    configs: Sequence[ModelConfig],
    settings: EngineConfig,
    ingress_threads: int = 0,
    topology: Topology | None = None,
    running: Mapping[str, ModelPlan] | None = None,
) -> Plan:
    """The plan for these models (one config per model) under the engine settings; ``running``:
    those already running, which keep their places."""
    policy = Policy.parse(
        settings.placement, strict=settings.placement_strict, ingress_threads=ingress_threads
    )
    topo = topology if topology is not None else engine_topology(settings)
    demands = [demand_for(c, settings) for c in configs]
    gpus = sorted({g for d in demands for g in d.gpus})
    gpu_nodes: dict[int, int] = {}
    if gpus and policy.kind != "roundrobin":
        from lumenrt.engine.gpu.devices import gpu_numa_nodes  # torch, only for GPU instances

        gpu_nodes = gpu_numa_nodes(gpus)
    try:
        return plan_placement(topo, demands, policy, running, gpu_nodes)
    except PlacementError as exc:
        raise PlacementError(f"placement ({policy.label}): {exc}") from None


def placements_of(plan: Plan, model: str, *, pin: bool = True, bind_memory: bool = True) -> list[Placement]:
    """The model's workers' placements; ``pin`` False (``engine.pin``): threads as planned, but no
    CPUs and no memory node; ``bind_memory`` False (``engine.memory_binding: first_touch``): pinned,
    memory left to first touch."""
    return [
        Placement(cores=w.cpus, intra_op_threads=w.threads, node=w.node, bind_memory=bind_memory, gpu=w.gpu)
        if pin
        else Placement(cores=(), intra_op_threads=w.threads, gpu=w.gpu)
        for w in plan.model(model).workers
    ]


def bind_this_thread(placement: Placement) -> None:
    """Pin the calling thread (a worker, before it loads its session) to its CPUs, and bind the
    memory it allocates from now on (the session's weights, its batch buffers, its backend
    threads' stacks: threads started later inherit both) to its node. The binding may not take:
    a container's seccomp profile may refuse set_mempolicy(2) (Docker's default does
    without CAP_SYS_NICE); the pages then follow first touch by the pinned thread, which is local
    too as long as the thread stays on its node."""
    if placement.cores:
        os.sched_setaffinity(0, placement.cores)  # this thread only (Linux)
    if placement.node < 0 or not placement.bind_memory:
        return
    try:
        set_thread_memory_node(placement.node)
    except (OSError, ValueError) as exc:
        logger.warning(
            "placement: memory not bound to node %d (first touch instead): %s", placement.node, exc
        )


def narrow_after_load(placement: Placement, session: object) -> None:
    """Once a worker's session exists: a backend that pinned its pool's threads one to a core of
    ``placement.cores[1:]`` (ONNX Runtime, ``pool_pinned``) leaves the worker ``cores[0]``, so that
    no two of the worker's compute threads share a core. Other backends start their pools later, in
    the worker's first run, and need the worker on all its cores for them to inherit."""
    if placement.cores and getattr(session, "pool_pinned", False):
        os.sched_setaffinity(0, placement.cores[:1])
