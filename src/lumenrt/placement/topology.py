"""The machine as placement sees it, read from sysfs and procfs (no root, no library).

What is read, all below ``root`` (``/`` on a real machine; a fake tree in the tests):
  - NUMA nodes: ``sys/devices/system/node/node*/{cpulist,meminfo,distance}``; a kernel without
    NUMA (no node folders) is one node 0 holding every online CPU and ``proc/meminfo``'s memory;
  - CPUs: ``sys/devices/system/cpu/online``, ``isolated``, and per CPU
    ``cpuN/topology/{physical_package_id,core_id,thread_siblings_list}`` (a physical core is a
    package and core id; SMT siblings share it) and ``cpuN/cache/index*/{level,type,shared_cpu_list}``
    (the CPUs sharing each L2 and L3);
  - a GPU's node (``pci_numa_node``): ``sys/bus/pci/devices/<PCI address>/numa_node``, for the
    address CUDA gives the device (engine/gpu/devices.py asks it);
  - this process (``pid``): its affinity (``proc/<pid>/status`` ``Cpus_allowed_list``) and its
    cgroup (``proc/<pid>/cgroup``): cgroup v2's ``cpuset.cpus.effective`` and ``cpu.max``, or v1's
    ``cpuset.effective_cpus`` and ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; a quota is the
    smallest set on the cgroup's path from the root.

``usable_cpus`` are the online CPUs that the affinity and the cpuset both allow, isolated ones
included only if the affinity names them (the kernel keeps other work off them, so a process pinned
there asked for it). ``busy_threads`` is what placement may keep busy at once: the usable CPUs,
capped by the CPU quota rounded down (at least one).

Every file is optional except the CPU list: a missing file leaves its field empty (a container
often hides parts of sysfs); a file that cannot be parsed raises TopologyError naming it.
"""

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SYS_CPU = "sys/devices/system/cpu"
SYS_NODE = "sys/devices/system/node"
SYS_PCI = "sys/bus/pci/devices"
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")  # domain:bus:device.function


class TopologyError(ValueError):
    """A file of the tree that says something placement cannot read."""


@dataclass(frozen=True, slots=True)
class Cpu:
    id: int
    node: int
    package: int
    core: int  # core id within the package
    siblings: tuple[int, ...]  # SMT threads of the same physical core, itself included
    l2: tuple[int, ...] = ()  # the CPUs sharing its L2 (empty: not reported)
    l3: tuple[int, ...] = ()  # the CPUs sharing its L3


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    cpus: tuple[int, ...]
    memory_bytes: int  # 0: not reported
    distances: tuple[int, ...]  # to node 0, 1, ... as the kernel lists them (empty: not reported)


@dataclass(frozen=True, slots=True)
class Topology:
    nodes: tuple[Node, ...]
    cpus: tuple[Cpu, ...]  # online CPUs, by id
    isolated: tuple[int, ...]
    affinity: tuple[int, ...]  # what the process may run on (Cpus_allowed_list)
    cgroup_version: int  # 2, 1, or 0 (none found)
    cpuset: tuple[int, ...]  # the cgroup's effective cpuset (empty: none found)
    quota_cpus: float | None  # the cgroup's CPU quota in CPUs (None: no limit)
    usable_cpus: tuple[int, ...] = field(default=())
    busy_threads: int = 0

    @property
    def physical_cores(self) -> list[tuple[int, ...]]:
        """The usable CPUs grouped by physical core (SMT siblings together), in CPU order."""
        usable = set(self.usable_cpus)
        seen: dict[tuple[int, int], list[int]] = {}
        for cpu in self.cpus:
            if cpu.id in usable:
                seen.setdefault((cpu.package, cpu.core), []).append(cpu.id)
        return [tuple(ids) for ids in seen.values()]

    def node_of(self, cpu: int) -> int:
        for c in self.cpus:
            if c.id == cpu:
                return c.node
        raise KeyError(cpu)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["physical_cores"] = [list(c) for c in self.physical_cores]
        return doc


def parse_cpulist(text: str, where: str = "cpulist") -> tuple[int, ...]:
    """``0-3,8,10-11`` -> (0, 1, 2, 3, 8, 10, 11); empty text -> ()."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if m is None:
            raise TopologyError(f"{where}: {text!r} is not a CPU list (like 0-3,8)")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low:
            raise TopologyError(f"{where}: range {part.strip()!r} runs backwards")
        out.update(range(low, high + 1))
    return tuple(sorted(out))


def read_topology(root: Path | str = "/", pid: int | str = "self") -> Topology:
    """The topology under ``root`` for process ``pid`` (see the top)."""
    root = Path(root)
    cpu_dir = root / SYS_CPU
    online_text = _read(cpu_dir / "online")
    if online_text is None:
        raise TopologyError(f"{cpu_dir / 'online'}: missing (is {root} a Linux sysfs tree?)")
    online = parse_cpulist(online_text, str(cpu_dir / "online"))
    nodes = _nodes(root, online)
    node_of = {cpu: n.id for n in nodes for cpu in n.cpus}
    cpus = tuple(_cpu(cpu_dir, i, node_of.get(i, 0)) for i in online)
    isolated = _cpulist_or_empty(cpu_dir / "isolated")
    status = _read(root / "proc" / str(pid) / "status") or ""
    m = re.search(r"^Cpus_allowed_list:\s*(\S*)\s*$", status, re.MULTILINE)
    affinity = parse_cpulist(m.group(1), "Cpus_allowed_list") if m else online
    version, cpuset, quota = _cgroup(root, pid)
    allowed = set(affinity) & set(online)
    if cpuset:
        allowed &= set(cpuset)
    usable = tuple(sorted(allowed))
    busy = len(usable)
    if quota is not None:
        busy = max(1, min(busy, math.floor(quota + 1e-9)))
    return Topology(
        nodes=nodes,
        cpus=cpus,
        isolated=isolated,
        affinity=affinity,
        cgroup_version=version,
        cpuset=cpuset,
        quota_cpus=quota,
        usable_cpus=usable,
        busy_threads=busy,
    )


def flat_topology(cpus: tuple[int, ...] | list[int]) -> Topology:
    """A machine known only by the CPUs this process may use: one node, no SMT, no limits."""
    ids = tuple(sorted(cpus))
    return Topology(
        nodes=(Node(0, ids, 0, (10,)),),
        cpus=tuple(Cpu(i, 0, 0, i, (i,)) for i in ids),
        isolated=(),
        affinity=ids,
        cgroup_version=0,
        cpuset=(),
        quota_cpus=None,
        usable_cpus=ids,
        busy_threads=len(ids),
    )


# ---- pieces ----------------------------------------------------------------------------------------


def pci_numa_node(address: str, root: Path | str = "/") -> int:
    """The NUMA node of the PCI device at ``address`` (``0000:3b:00.0``) as sysfs says; -1 when
    unknown: no such device, a kernel without NUMA (it says -1), or not an address (never a path)."""
    address = address.strip().lower()
    if not PCI_ADDRESS.fullmatch(address):
        return -1
    text = _read(Path(root) / SYS_PCI / address / "numa_node")
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return -1
    return node if node >= 0 else -1


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def _cpulist_or_empty(path: Path) -> tuple[int, ...]:
    text = _read(path)
    return parse_cpulist(text, str(path)) if text is not None else ()


def _int(path: Path, default: int) -> int:
    text = _read(path)
    if text is None:
        return default
    try:
        return int(text.strip())
    except ValueError:
        raise TopologyError(f"{path}: {text.strip()!r} is not a number") from None


def _nodes(root: Path, online: tuple[int, ...]) -> tuple[Node, ...]:
    node_dir = root / SYS_NODE
    found = sorted(
        (int(p.name[4:]), p)
        for p in (node_dir.iterdir() if node_dir.is_dir() else ())
        if re.fullmatch(r"node\d+", p.name)
    )
    if not found:  # no NUMA in this kernel (or hidden): one node of everything
        meminfo = _read(root / "proc" / "meminfo") or ""
        m = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.MULTILINE)
        return (Node(0, online, int(m.group(1)) * 1024 if m else 0, (10,)),)
    nodes = []
    for nid, path in found:
        cpus = tuple(c for c in _cpulist_or_empty(path / "cpulist") if c in online)
        meminfo = _read(path / "meminfo") or ""
        m = re.search(r"MemTotal:\s*(\d+)\s*kB", meminfo)
        distance_text = _read(path / "distance") or ""
        try:
            distances = tuple(int(d) for d in distance_text.split())
        except ValueError:
            raise TopologyError(
                f"{path / 'distance'}: {distance_text.strip()!r} is not a list of numbers"
            ) from None
        nodes.append(Node(nid, cpus, int(m.group(1)) * 1024 if m else 0, distances))
    return tuple(nodes)


def _cpu(cpu_dir: Path, i: int, node: int) -> Cpu:
    topo = cpu_dir / f"cpu{i}" / "topology"
    siblings = _cpulist_or_empty(topo / "thread_siblings_list") or (i,)
    l2: tuple[int, ...] = ()
    l3: tuple[int, ...] = ()
    cache_dir = cpu_dir / f"cpu{i}" / "cache"
    for index in sorted(cache_dir.glob("index*")) if cache_dir.is_dir() else ():
        kind = (_read(index / "type") or "").strip()
        if kind == "Instruction":
            continue
        level = _int(index / "level", 0)
        shared = _cpulist_or_empty(index / "shared_cpu_list")
        if level == 2:
            l2 = shared
        elif level == 3:
            l3 = shared
    return Cpu(
        id=i,
        node=node,
        package=_int(topo / "physical_package_id", 0),
        core=_int(topo / "core_id", i),
        siblings=siblings,
        l2=l2,
        l3=l3,
    )


def _cgroup(root: Path, pid: int | str) -> tuple[int, tuple[int, ...], float | None]:
    """(version, effective cpuset, CPU quota in CPUs) of the process's cgroup."""
    text = _read(root / "proc" / str(pid) / "cgroup")
    if text is None:
        return 0, (), None
    v1: dict[str, str] = {}
    v2_path: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    fs = root / "sys" / "fs" / "cgroup"
    if "cpuset" in v1 or "cpu" in v1:
        base = fs / "cpuset"
        cpuset = _first_cpulist(base, v1.get("cpuset", "/"), ("cpuset.effective_cpus", "cpuset.cpus"))
        cpu_base = next((fs / name for name in ("cpu,cpuacct", "cpu") if (fs / name).is_dir()), fs / "cpu")
        quota = _v1_quota(cpu_base, v1.get("cpu", "/"))
        return 1, cpuset, quota
    if v2_path is not None:
        cpuset = _first_cpulist(fs, v2_path, ("cpuset.cpus.effective",))
        return 2, cpuset, _v2_quota(fs, v2_path)
    return 0, (), None


def _inside(base: Path, path: str) -> Path:
    return base.joinpath(*[p for p in path.split("/") if p and p != ".."])


def _ancestors(base: Path, path: str) -> list[Path]:
    """The cgroup's folder and each above it up to ``base``, nearest first."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _first_cpulist(base: Path, path: str, names: tuple[str, ...]) -> tuple[int, ...]:
    for folder in _ancestors(base, path):  # a cgroup namespace may hide the leaf: nearest found
        for name in names:
            text = _read(folder / name)
            if text is not None and text.strip():
                return parse_cpulist(text, str(folder / name))
    return ()


def _v2_quota(fs: Path, path: str) -> float | None:
    quota: float | None = None
    for folder in _ancestors(fs, path):
        text = _read(folder / "cpu.max")
        if text is None:
            continue
        fields = text.split()
        if len(fields) != 2:
            raise TopologyError(f"{folder / 'cpu.max'}: {text.strip()!r} is not 'QUOTA PERIOD'")
        if fields[0] == "max":
            continue
        try:
            cpus = int(fields[0]) / int(fields[1])
        except (ValueError, ZeroDivisionError):
            raise TopologyError(f"{folder / 'cpu.max'}: {text.strip()!r} is not 'QUOTA PERIOD'") from None
        quota = cpus if quota is None else min(quota, cpus)
    return quota


def _v1_quota(base: Path, path: str) -> float | None:
    quota: float | None = None
    for folder in _ancestors(base, path):
        q = _int(folder / "cpu.cfs_quota_us", -1)
        period = _int(folder / "cpu.cfs_period_us", 0)
        if q > 0 and period > 0:
            quota = q / period if quota is None else min(quota, q / period)
    return quota


# ---- printing ----------------------------------------------------------------------------------------


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5' (the kernel's form; '' for none)."""
    out: list[str] = []
    ids = sorted(cpus)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def _ranges(cpus: tuple[int, ...] | list[int]) -> str:
    return format_cpulist(cpus) or "-"


def describe(topo: Topology) -> str:
    """The topology as a few tables (``lumenrt topology``)."""
    lines = ["NUMA nodes", "| node | CPUs | usable | memory GiB | distances |", "|---|---|---|---|---|"]
    usable = set(topo.usable_cpus)
    for n in topo.nodes:
        mem = f"{n.memory_bytes / 2**30:.1f}" if n.memory_bytes else "-"
        mine = [c for c in n.cpus if c in usable]
        lines.append(
            f"| {n.id} | {_ranges(n.cpus)} | {_ranges(mine)} | {mem} | {' '.join(map(str, n.distances)) or '-'} |"
        )
    cores = topo.physical_cores
    smt = max((len(c) for c in cores), default=1)
    l3_groups = sorted({c.l3 for c in topo.cpus if c.l3})
    lines += [
        "",
        f"physical cores usable: {len(cores)} ({smt} thread{'s' if smt > 1 else ''} each at most): "
        + " ".join("(" + ",".join(map(str, c)) + ")" for c in cores),
        "L3 groups: " + (" ".join(_ranges(g) for g in l3_groups) if l3_groups else "not reported"),
        f"affinity: {_ranges(topo.affinity)}   cpuset: {_ranges(topo.cpuset) if topo.cpuset else 'none'}"
        f" (cgroup v{topo.cgroup_version if topo.cgroup_version else '-'})   "
        f"quota: {'none' if topo.quota_cpus is None else f'{topo.quota_cpus:g} CPUs'}   "
        f"isolated: {_ranges(topo.isolated) if topo.isolated else 'none'}",
        f"usable CPUs: {_ranges(topo.usable_cpus)}; busy threads at most: {topo.busy_threads}",
    ]
    return "\n".join(lines)
