"""The placement plan: which CPUs every loaded model's workers run on, how many compute threads
each gets, and which NUMA node holds its memory, planned for all models together.

Input: the machine (``Topology``), one ``Demand`` per model (its ``instance_group``), and the
server's ``Policy``. Output: a ``Plan``, or ``PlacementError`` naming what cannot be honoured.

Counting. A *busy thread* is one that computes while the server is under load: each ingress
thread (``Policy.ingress_threads``: ``lumenrt serve`` runs one event loop, which also runs the
inline lane's small models), and each worker's compute threads (``threads``: the worker itself plus
its backend's pool, ONNX Runtime's ``intra_op_num_threads`` counting the caller). The budget is
``Topology.busy_threads``: the usable CPUs (affinity and cpuset), capped by the cgroup's CPU quota.

Rules, in the order applied
  1. Never silently over budget. What a config asks for explicitly and the machine cannot honour
     at all (a CPU that is not usable, a node that does not exist or has no usable CPU, the same CPU
     claimed by two models) is refused. What the plan must cut to fit (fewer instances or threads
     than asked, or models sharing CPUs when they outnumber them) is done and said: each cut is a
     warning in the plan, which ``lumenrt serve`` logs and ``lumenrt topology --plan`` prints.
     ``strict`` refuses instead of cutting.
  2. Whole physical cores first: a node's CPUs are handed out first threads of each core first,
     SMT siblings last, so two compute threads share a core only when the budget needs it.
  3. A worker's CPUs lie on one node, and its memory is bound there.
  4. ``spread`` (default) deals a model's instances over the nodes in turn, so that every node
     serves; ``pack`` fills node 0 first (fewest nodes, shared L3); ``node:N`` uses node N only.
     A model's ``numa_node`` keeps it on that node whatever the policy.
  5. The quota: with a quota below the usable CPUs, only ``busy_threads`` CPUs are used (chosen by
     the policy's order), so the threads the plan starts never exceed what the quota lets run.
  6. Ingress first: the ingress threads are pinned to the last CPUs of the first node's
     preference order (an SMT sibling where there is one) when at least one CPU per model is left.
     Those CPUs are the ingress's own only on a host with ``INGRESS_ALONE_MIN_CPUS`` (10) or more
     CPUs left per ingress thread (or under ``strict``): there a CPU of its own costs the models at
     most a tenth of the compute round-robin would give them. On a smaller host the models keep
     every CPU and a worker shares each ingress CPU, and the plan says so in a warning: a model
     whose work dwarfs the event loop's (SqueezeNet on the 2-CPU VM: 86-93 requests/s with the
     loop's CPU to itself, against 173/s round-robin) would otherwise run on half the machine,
     while a light model gains little from it, since its requests run on the loop anyway (the
     inline lane, engine/lane.py).
     When there are not that many CPUs (the 2-CPU VM with three models and an event loop), models
     cannot be kept apart by CPU: each model's instances (one per CPU unless ``count`` says) are
     placed round-robin over the plan's CPUs of their node, as rule 8 does, and the plan says so
     in a warning. Two other answers were measured on the 2-CPU VM under the mixed load of
     benchmarks/placement.py and not kept: workers free to use every CPU (squeezenet 0.885x the
     throughput, digits_mlp 1.10x, medians of 3), and workers below the event loop's priority
     (nice +10: squeezenet 0.68x, digits_mlp 1.90x): each a trade between the two models, not a
     gain.
  7. Models with explicit ``cores`` take exactly those; the rest divide what is left evenly, in the
     order given, models tied to a node first. Within a model's share: ``count`` instances (0: one
     per CPU) of ``threads`` compute threads (0: the share divided by the count).
  8. ``roundrobin`` is lumenrt's placement before planning, kept for the architecture matrix: each
     model gets ``count`` workers (default: one per usable CPU) pinned round-robin over every usable
     CPU, with no budget across models.
  9. A GPU instance (``Demand.gpus``, one entry per instance) is one busy host thread: it gathers
     batches, launches the model and waits for its device. Each gets one CPU of its own, after the
     ingress and before the CPU workers divide what is left (a starved feeder idles a device worth
     many cores), from the fullest node (spread) or the first with one free (pack, node:N); with
     none left, or when crowded (rule 6), it shares the least given CPU, and the plan says so.
     A GPU whose NUMA node is known (``gpu_nodes``: sysfs, for the PCI address CUDA gives it)
     gets its host thread on that node while it has a free CPU (its copies cross no socket link);
     otherwise the plan says the thread sits off the GPU's node.

This module reads nothing: it is a function of its inputs, so the tests give it fake machines.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lumenrt.placement.topology import Topology, format_cpulist

POLICIES = ("spread", "pack", "roundrobin")  # and "node:N"
# Rule 6: the ingress threads get CPUs of their own only on a host with at least this many CPUs
# left per ingress thread, where that costs the models at most a tenth of what round-robin gives them.
INGRESS_ALONE_MIN_CPUS = 10


class PlacementError(ValueError):
    """A plan that cannot be made: what was asked, what the machine has, and what to change."""


@dataclass(frozen=True, slots=True)
class Demand:
    """What one model's config asks for (its ``instance_group``)."""

    model: str
    count: int = 0  # instances; 0: one per CPU of the model's share
    cores: tuple[int, ...] = ()  # exactly these CPUs (instance_group.cores, a host policy's cpu-cores)
    node: int | None = None  # only this node's CPUs (instance_group.numa_node)
    gpus: tuple[int, ...] = ()  # the device of each GPU instance (one host thread each: rule 9)
    cpu: bool = True  # False: GPU instances only (no KIND_CPU group)


@dataclass(frozen=True, slots=True)
class Policy:
    kind: str = "spread"  # spread | pack | node | roundrobin
    node: int | None = None  # kind "node": the node
    strict: bool = False  # refuse instead of shrinking or sharing
    ingress_threads: int = 0  # busy threads of the front ends (lumenrt serve: 1)

    @classmethod
    def parse(cls, text: str, *, strict: bool = False, ingress_threads: int = 0) -> "Policy":
        """``spread``, ``pack``, ``roundrobin`` or ``node:N``; ValueError otherwise."""
        if text.startswith("node:"):
            number = text[5:]
            if not number.isdigit():
                raise ValueError(f"'node:N' needs a node number, got {text!r}")
            return cls("node", int(number), strict, ingress_threads)
        if text not in POLICIES:
            raise ValueError(f"must be one of {', '.join(POLICIES)} or node:N, got {text!r}")
        return cls(text, None, strict, ingress_threads)

    @property
    def label(self) -> str:
        return f"node:{self.node}" if self.kind == "node" else self.kind


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    cpus: tuple[int, ...]  # the worker (and its backend's threads) is pinned to these
    threads: int  # compute threads of its session (the worker included), one per CPU
    node: int  # where its memory is bound (-1: its CPUs span nodes; roundrobin only)
    gpu: int = -1  # a GPU instance's device (one host thread: rule 9); -1: a CPU instance


@dataclass(frozen=True, slots=True)
class ModelPlan:
    model: str
    workers: tuple[WorkerPlan, ...]
    shared: bool = False  # its CPUs also run another model's workers (rule 1's last resort)

    @property
    def busy_threads(self) -> int:
        return sum(w.threads for w in self.workers)


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    budget: int  # Topology.busy_threads
    ingress_cpus: tuple[int, ...]  # () : the ingress threads are not pinned
    models: tuple[ModelPlan, ...]
    warnings: tuple[str, ...] = ()
    ingress_threads: int = 0

    @property
    def busy_threads(self) -> int:
        return self.ingress_threads + sum(m.busy_threads for m in self.models)

    @property
    def oversubscribed(self) -> bool:
        return self.busy_threads > self.budget

    def model(self, name: str) -> ModelPlan:
        for m in self.models:
            if m.model == name:
                return m
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "budget": self.budget,
            "busy_threads": self.busy_threads,
            "oversubscribed": self.oversubscribed,
            "ingress_cpus": list(self.ingress_cpus),
            "models": {
                m.model: {
                    "shared": m.shared,
                    "workers": [
                        {"cpus": list(w.cpus), "threads": w.threads, "node": w.node, "gpu": w.gpu}
                        for w in m.workers
                    ],
                }
                for m in self.models
            },
            "warnings": list(self.warnings),
        }


def preference_order(topo: Topology, node: int) -> list[int]:
    """The node's usable CPUs, first thread of every physical core first, SMT siblings after."""
    cores = [c for c in topo.physical_cores if topo.node_of(c[0]) == node]
    depth = max((len(c) for c in cores), default=0)
    return [c[k] for k in range(depth) for c in cores if k < len(c)]


def plan_placement(
    topo: Topology,
    demands: Sequence[Demand],
    policy: Policy,
    running: Mapping[str, ModelPlan] | None = None,
    gpu_nodes: Mapping[int, int] | None = None,
) -> Plan:
    """The plan for ``demands`` on ``topo`` under ``policy`` (see the rules at the top).
    ``running``: the models of ``demands`` already running, with their places, which the plan keeps
    (workers do not move); the others are planned around them. ``gpu_nodes``: the NUMA node of
    each GPU device the demands name (-1 or absent: unknown), for rule 9."""
    if policy.kind == "roundrobin":
        return _round_robin(topo, demands, policy)
    return _Planner(topo, demands, policy, dict(running or {}), gpu_nodes=dict(gpu_nodes or {})).plan()


@dataclass(slots=True)
class _Planner:
    topo: Topology
    demands: Sequence[Demand]
    policy: Policy
    running: dict[str, ModelPlan]
    free: dict[int, list[int]] = field(default_factory=dict)  # node -> CPUs not yet given, in order
    warnings: list[str] = field(default_factory=list)
    given: dict[int, int] = field(default_factory=dict)  # CPU -> busy threads placed on it so far
    planned: tuple[int, ...] = ()  # the CPUs the plan uses (the policy's nodes, within the quota)
    cuts: int = 0  # warnings that shrink or share (rule 1)
    gpu_nodes: dict[int, int] = field(default_factory=dict)  # GPU device -> its NUMA node (rule 9)

    def plan(self) -> Plan:
        topo, policy = self.topo, self.policy
        nodes = [n.id for n in topo.nodes if preference_order(topo, n.id)]
        if not nodes:
            raise PlacementError("no usable CPU: the affinity and the cgroup's cpuset leave none")
        if policy.kind == "node":
            if policy.node not in [n.id for n in topo.nodes]:
                raise PlacementError(
                    f"policy node:{policy.node}: no such NUMA node (nodes: {[n.id for n in topo.nodes]})"
                )
            if policy.node not in nodes:
                raise PlacementError(f"policy node:{policy.node}: the node has no CPU this process may use")
            nodes = [policy.node]
        self.free = {n: preference_order(topo, n) for n in nodes}
        self._apply_quota()
        self.planned = tuple(sorted(c for v in self.free.values() for c in v))
        self._check_explicit()
        plans: dict[str, ModelPlan] = {}
        for d in self.demands:  # what is held or claimed first: the ingress and the others plan around it
            if d.model in self.running:
                plans[d.model] = held = self.running[d.model]
                for w in held.workers:
                    self._take(w.cpus)
                    self._give(w.cpus)
            elif d.cores and d.cpu:
                plans[d.model] = self._explicit(d)
        cpus_left = sum(len(v) for v in self.free.values())
        auto = [d for d in self.demands if d.model not in plans and d.cpu]
        feeding = [d for d in self.demands if d.model not in self.running and d.gpus]
        gpu_threads = sum(len(d.gpus) for d in feeding)
        ingress: tuple[int, ...] = ()
        if policy.ingress_threads and cpus_left - policy.ingress_threads - gpu_threads >= len(auto):
            first = self.free[nodes[0]]
            ingress = tuple(first[-policy.ingress_threads :])
            if self._ingress_alone(cpus_left, auto):
                del first[-policy.ingress_threads :]
            else:  # rule 6: the models keep every CPU; the ingress shares its own with a worker
                self._cut(
                    f"ingress CPU(s) {format_cpulist(ingress)} also run workers: a CPU of its own for each "
                    f"of {policy.ingress_threads} ingress thread(s) would take more than "
                    f"1/{INGRESS_ALONE_MIN_CPUS} of the {cpus_left} CPU(s) the models would use"
                )
            self._give(ingress)
        crowded = bool(policy.ingress_threads) and not ingress and bool(auto or feeding)
        if crowded:
            gpu_part = f", {gpu_threads} GPU instance(s)" if gpu_threads else ""
            self._cut(
                f"{len(auto)} model(s){gpu_part} and {policy.ingress_threads} ingress thread(s) need more "
                f"than the {cpus_left} CPU(s) left: each model's workers are placed round-robin over all "
                "of them, sharing them with the other models and the ingress"
            )
        feeders = {d.model: self._gpu_hosts(d, crowded) for d in feeding}  # rule 9: before the shares
        # models tied to a node first: they have fewer choices
        ordered = sorted(auto, key=lambda d: d.node is None)
        for i, d in enumerate(ordered):
            plans[d.model] = self._crowded(d) if crowded else self._share(d, ordered[i:])
        for name, hosts in feeders.items():
            cpu_workers = plans[name].workers if name in plans else ()
            plans[name] = ModelPlan(name, (*cpu_workers, *hosts))
        doubled = {c for c, n in self.given.items() if n > 1}
        models = tuple(
            replace(plans[d.model], shared=True)
            if any(set(w.cpus) & doubled for w in plans[d.model].workers)
            else plans[d.model]
            for d in self.demands
        )
        busy = policy.ingress_threads + sum(m.busy_threads for m in models)
        if busy > topo.busy_threads and not self.cuts:  # rule 1: an overrun no cut has explained
            self._cut(f"{busy} busy threads planned for a budget of {topo.busy_threads}")
        return Plan(
            policy=policy.label,
            budget=topo.busy_threads,
            ingress_cpus=ingress,
            models=models,
            warnings=tuple(self.warnings),
            ingress_threads=policy.ingress_threads,
        )

    # ---- steps ----------------------------------------------------------------------------------

    def _ingress_alone(self, cpus_left: int, auto: Sequence[Demand]) -> bool:
        """Rule 6: whether the ingress threads get CPUs the models' workers do not use."""
        if not auto or self.policy.strict:  # nothing to share with; strict never oversubscribes
            return True
        return cpus_left >= INGRESS_ALONE_MIN_CPUS * self.policy.ingress_threads

    def _cut(self, message: str) -> None:
        if self.policy.strict:
            raise PlacementError(f"{message} (strict placement refuses to shrink or share)")
        self.warnings.append(message)
        self.cuts += 1

    def _apply_quota(self) -> None:
        """Rule 5: keep ``busy_threads`` CPUs, taken in the policy's order."""
        keep = self.topo.busy_threads
        total = sum(len(v) for v in self.free.values())
        if keep >= total:
            return
        kept: dict[int, list[int]] = {n: [] for n in self.free}
        queues = {n: list(v) for n, v in self.free.items()}
        while keep > 0:
            for n in list(queues):
                if keep == 0:
                    break
                if queues[n]:
                    kept[n].append(queues[n].pop(0))
                    keep -= 1
                    if self.policy.kind == "pack":
                        break  # pack: one node until it is empty
                else:
                    del queues[n]
        self.free = {n: v for n, v in kept.items()}

    def _check_explicit(self) -> None:
        usable = set(self.topo.usable_cpus)
        node_ids = [n.id for n in self.topo.nodes]
        owner: dict[int, str] = {}
        for d in self.demands:
            if d.node is not None and d.node not in node_ids:
                raise PlacementError(
                    f"{d.model}: instance_group.numa_node {d.node}: no such node (nodes: {node_ids})"
                )
            if d.node is not None and not preference_order(self.topo, d.node):
                raise PlacementError(
                    f"{d.model}: instance_group.numa_node {d.node}: the node has no CPU this process may use "
                    f"(usable: {format_cpulist(self.topo.usable_cpus)})"
                )
            for i, cpu in enumerate(d.cores):
                if d.node is not None and cpu in usable and self.topo.node_of(cpu) != d.node:
                    raise PlacementError(
                        f"{d.model}: instance_group.cores[{i}] = {cpu} is not on node {d.node}, "
                        f"which its host policy names"
                    )
                if cpu not in usable:
                    raise PlacementError(
                        f"{d.model}: instance_group.cores[{i}] = {cpu} is not usable by this process "
                        f"(usable: {format_cpulist(self.topo.usable_cpus)})"
                    )
                if cpu in owner:
                    raise PlacementError(
                        f"{d.model}: instance_group.cores[{i}] = {cpu} is also given to {owner[cpu]}: "
                        "two models' workers on one CPU would compete for it"
                    )
                owner[cpu] = d.model

    def _take(self, cpus: Sequence[int]) -> None:
        for v in self.free.values():
            v[:] = [c for c in v if c not in cpus]

    def _give(self, cpus: Sequence[int]) -> None:
        for c in cpus:
            self.given[c] = self.given.get(c, 0) + 1

    def _explicit(self, d: Demand) -> ModelPlan:
        self._take(d.cores)
        count = d.count or len(d.cores)
        if count > len(d.cores):
            self._cut(
                f"{d.model}: {count} instances asked on {len(d.cores)} given core(s): {len(d.cores)} started"
            )
            count = len(d.cores)
        threads = len(d.cores) // count
        workers = []
        for i in range(count):
            cpus = d.cores[i * threads : (i + 1) * threads]
            nodes = {self.topo.node_of(c) for c in cpus}
            if len(nodes) > 1:
                self.warnings.append(
                    f"{d.model}: instance {i}'s cores {format_cpulist(cpus)} span nodes {sorted(nodes)}"
                )
            workers.append(WorkerPlan(cpus, threads, min(nodes) if len(nodes) == 1 else -1))
            self._give(cpus)
        return ModelPlan(d.model, tuple(workers))

    def _share(self, d: Demand, rest: Sequence[Demand]) -> ModelPlan:
        """Rule 7: this model's even share of what is left, then its instances cut from it."""
        pools = [d.node] if d.node is not None else list(self.free)
        if d.node is not None and d.node not in self.free:
            raise PlacementError(
                f"{d.model}: instance_group.numa_node {d.node} is outside policy {self.policy.label}"
            )
        left = sum(len(self.free[n]) for n in pools)
        if d.node is None:
            share = -(-sum(len(v) for v in self.free.values()) // len(rest))
        else:  # divided among the models that may use its node (the untied ones too)
            share = -(-left // len([r for r in rest if r.node in (None, d.node)]))
        share = min(left, share)  # rounded up: when CPUs run short, the last ones share
        if share == 0 or left == 0:
            return self._shared(d)
        count = d.count or share
        if count > share:
            self._cut(f"{d.model}: {count} instances asked, {share} CPU(s) for it: {share} started")
            count = share
        threads = min(share // count, max(len(self.free[n]) for n in pools))  # rule 3: one node
        workers = []
        for i in range(count):
            node = self._node_for(pools, threads, i)
            avail = self.free[node]
            if not avail:  # the share spanned nodes and the rest ran out
                self._cut(f"{d.model}: {i} of {count} instances placed, no CPU left for the rest")
                break
            if len(avail) < threads:  # no node has room for a whole instance: fewer threads
                self._cut(
                    f"{d.model}: instance {i} gets {len(avail)} thread(s), no node had {threads} CPUs free"
                )
            cpus = tuple(avail[:threads])
            del avail[: len(cpus)]
            self._give(cpus)
            workers.append(WorkerPlan(cpus, len(cpus), node))
        return ModelPlan(d.model, tuple(workers))

    def _crowded(self, d: Demand) -> ModelPlan:
        """Rule 6's crowded case: ``count`` instances (0: one per CPU) dealt over the plan's nodes
        (its own node if it is tied to one), round-robin over each node's plan CPUs (rule 8)."""
        if d.node is not None and d.node not in self.free:
            raise PlacementError(
                f"{d.model}: instance_group.numa_node {d.node} is outside policy {self.policy.label}"
            )
        nodes = [d.node] if d.node is not None else sorted({self.topo.node_of(c) for c in self.planned})
        by_node = {n: [c for c in self.planned if self.topo.node_of(c) == n] for n in nodes}
        by_node = {n: cpus or preference_order(self.topo, n) for n, cpus in by_node.items()}
        count = d.count or sum(len(v) for v in by_node.values())
        workers = []
        for k, node in enumerate(nodes):
            for cpus in round_robin(len(range(k, count, len(nodes))), by_node[node]):
                self._give(cpus)
                workers.append(WorkerPlan(cpus, len(cpus), node))
        return ModelPlan(d.model, tuple(workers))

    def _gpu_hosts(self, d: Demand, crowded: bool) -> tuple[WorkerPlan, ...]:
        """Rule 9: one CPU of its own for each GPU instance's host thread, or a shared one."""
        hosts: list[WorkerPlan] = []
        shared = far = 0
        for gpu in d.gpus:
            pools = [n for n, v in self.free.items() if v]
            near = self.gpu_nodes.get(gpu, -1)
            if crowded or not pools:
                cpu = min(self.planned, key=lambda c: (self.given.get(c, 0), -c))
                shared += 1
            else:
                if near in pools:
                    node = near
                elif self.policy.kind == "spread":
                    node = max(pools, key=lambda n: (len(self.free[n]), -n))
                else:
                    node = pools[0]
                cpu = self.free[node].pop(0)
            self._give((cpu,))
            hosts.append(WorkerPlan((cpu,), 1, self.topo.node_of(cpu), gpu=gpu))
            far += 0 <= near != hosts[-1].node
        if shared and not crowded:  # crowded: said once for all models
            self._cut(
                f"{d.model}: {shared} of {len(d.gpus)} GPU instance thread(s) share a CPU: none was left"
            )
        if far:
            self.warnings.append(
                f"{d.model}: {far} of {len(d.gpus)} GPU instance thread(s) run off their GPU's NUMA "
                "node: no CPU of the plan was free there"
            )
        return tuple(hosts)

    def _node_for(self, pools: list[int], threads: int, i: int) -> int:
        """spread: the next node in turn with room; pack and node:N: the first with room."""
        fits = [n for n in pools if len(self.free[n]) >= threads] or [
            max(pools, key=lambda n: len(self.free[n]))
        ]
        if self.policy.kind == "spread":
            return max(fits, key=lambda n: (len(self.free[n]), -n))
        return fits[0]

    def _shared(self, d: Demand) -> ModelPlan:
        """Rule 1's last resort: no CPU left for this model; one single-threaded worker on the CPU
        the fewest other workers were given (its node's, if it is tied to one)."""
        candidates = [c for c in self.planned if d.node is None or self.topo.node_of(c) == d.node]
        candidates = candidates or preference_order(self.topo, d.node if d.node is not None else 0)
        cpu = min(candidates, key=lambda c: (self.given.get(c, 0), -c))  # the least given; the last on ties
        self._give((cpu,))
        self._cut(
            f"{d.model}: no CPU left for it ({len(self.demands)} models and {self.policy.ingress_threads} ingress "
            f"thread(s) on {self.topo.busy_threads} CPU(s)): one worker sharing CPU {cpu}"
        )
        return ModelPlan(d.model, (WorkerPlan((cpu,), 1, self.topo.node_of(cpu)),), shared=True)


def round_robin(n_workers: int, cpus: Sequence[int]) -> list[tuple[int, ...]]:
    """Rule 8: each worker's CPUs. With fewer workers than CPUs, each gets a disjoint run of
    len(cpus) // n_workers (a backend's pool, started by the pinned worker, inherits its affinity:
    with one CPU it would crowd every compute thread onto it); otherwise one CPU each, in turn."""
    intra = max(1, len(cpus) // max(n_workers, 1))
    return [tuple(cpus[(i * intra + k) % len(cpus)] for k in range(intra)) for i in range(n_workers)]


def _round_robin(topo: Topology, demands: Sequence[Demand], policy: Policy) -> Plan:
    models = []
    for d in demands:
        mine = d.cores or (preference_order(topo, d.node) if d.node is not None else topo.usable_cpus)
        if not mine:
            raise PlacementError(f"{d.model}: instance_group.numa_node {d.node}: no usable CPU there")
        workers = []
        for cpus in round_robin(d.count or len(mine), mine) if d.cpu else []:
            nodes = {topo.node_of(c) for c in cpus}
            workers.append(WorkerPlan(cpus, len(cpus), min(nodes) if len(nodes) == 1 else -1))
        hosts = [cpus[0] for cpus in round_robin(len(d.gpus), topo.usable_cpus)] if d.gpus else []
        workers += [WorkerPlan((c,), 1, topo.node_of(c), gpu=g) for c, g in zip(hosts, d.gpus, strict=True)]
        models.append(ModelPlan(d.model, tuple(workers)))
    busy = policy.ingress_threads + sum(m.busy_threads for m in models)
    warnings: tuple[str, ...] = ()
    if busy > topo.busy_threads:  # rule 1: said, or refused if strict
        message = f"roundrobin: {busy} busy threads for a budget of {topo.busy_threads}"
        if policy.strict:
            raise PlacementError(f"{message} (strict placement refuses to shrink or share)")
        warnings = (message,)
    return Plan("roundrobin", topo.busy_threads, (), tuple(models), warnings, policy.ingress_threads)


def describe_plan(plan: Plan) -> str:
    """The plan as a table (``lumenrt topology --plan``)."""
    lines = [
        f"placement plan: policy {plan.policy}; busy threads {plan.busy_threads} of {plan.budget}"
        + (" (OVERSUBSCRIBED)" if plan.oversubscribed else ""),
        f"ingress: {plan.ingress_threads} thread(s) on "
        + (format_cpulist(plan.ingress_cpus) if plan.ingress_cpus else "any usable CPU"),
        "| model | instance | CPUs | threads | memory node |",
        "|---|---|---|---|---|",
    ]
    for m in plan.models:
        for i, w in enumerate(m.workers):
            node = str(w.node) if w.node >= 0 else "spans nodes"
            instance = f"{i} (GPU {w.gpu})" if w.gpu >= 0 else str(i)
            lines.append(
                f"| {m.model} | {instance} | {format_cpulist(w.cpus)}{' (shared)' if m.shared else ''} "
                f"| {w.threads} | {node} |"
            )
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)
