"""Fake sysfs/procfs trees, one per machine the placement tests describe, written in the kernel's
own file formats (checked against this VM's tree): ``Machine.write(root)`` lays one out."""

from dataclasses import dataclass, field
from pathlib import Path

from lumenrt.placement.topology import format_cpulist as cpulist


@dataclass
class Machine:
    """CPU -> (node, package, core); SMT siblings are CPUs with the same package and core."""

    cpus: dict[int, tuple[int, int, int]]
    node_memory_kb: dict[int, int]
    distances: dict[int, list[int]]
    l3: list[list[int]]  # groups of CPUs sharing an L3
    numa_folders: bool = True  # False: a kernel without NUMA (no node folders)
    isolated: list[int] = field(default_factory=list)
    affinity: list[int] | None = None  # None: every CPU
    cgroup: str = "0::/\n"  # proc/self/cgroup
    files: dict[str, str] = field(default_factory=dict)  # more files (cgroup limits), by path

    def write(self, root: Path) -> Path:
        cpu_dir = root / "sys/devices/system/cpu"
        _put(cpu_dir / "online", cpulist(list(self.cpus)) + "\n")
        _put(cpu_dir / "isolated", cpulist(self.isolated) + "\n")
        for cpu, (_node, package, core) in self.cpus.items():
            topo = cpu_dir / f"cpu{cpu}" / "topology"
            siblings = [c for c, (_, p, k) in self.cpus.items() if (p, k) == (package, core)]
            _put(topo / "physical_package_id", f"{package}\n")
            _put(topo / "core_id", f"{core}\n")
            _put(topo / "thread_siblings_list", cpulist(siblings) + "\n")
            caches = [(1, "Data", siblings), (1, "Instruction", siblings), (2, "Unified", siblings)]
            group = next((g for g in self.l3 if cpu in g), None)
            if group is not None:
                caches.append((3, "Unified", group))
            for index, (level, kind, shared) in enumerate(caches):
                folder = cpu_dir / f"cpu{cpu}" / "cache" / f"index{index}"
                _put(folder / "level", f"{level}\n")
                _put(folder / "type", f"{kind}\n")
                _put(folder / "shared_cpu_list", cpulist(shared) + "\n")
        nodes = sorted({node for node, _, _ in self.cpus.values()})
        if self.numa_folders:
            for node in nodes:
                folder = root / f"sys/devices/system/node/node{node}"
                mine = [c for c, (n, _, _) in self.cpus.items() if n == node]
                _put(folder / "cpulist", cpulist(mine) + "\n")
                kb = self.node_memory_kb[node]
                _put(
                    folder / "meminfo", f"Node {node} MemTotal:       {kb} kB\nNode {node} MemFree:   1 kB\n"
                )
                _put(folder / "distance", " ".join(map(str, self.distances[node])) + "\n")
        total = sum(self.node_memory_kb.values())
        _put(root / "proc/meminfo", f"MemTotal:       {total} kB\nMemFree:        1 kB\n")
        allowed = self.affinity if self.affinity is not None else list(self.cpus)
        _put(root / "proc/self/status", f"Name:\tpython\nCpus_allowed_list:\t{cpulist(allowed)}\n")
        _put(root / "proc/self/cgroup", self.cgroup)
        for path, text in self.files.items():
            _put(root / path, text)
        return root


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def this_vm() -> Machine:
    """The 2-core development VM: one node, no SMT, one L3, cgroup v1 (hybrid), no quota."""
    return Machine(
        cpus={0: (0, 0, 0), 1: (0, 0, 1)},
        node_memory_kb={0: 9135904},
        distances={0: [10]},
        l3=[[0, 1]],
        cgroup="9:name=systemd:/\n4:memory:/process_api/x\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n",
        files={
            "sys/fs/cgroup/cpuset/cpuset.effective_cpus": "0-1\n",
            "sys/fs/cgroup/cpuset/cpuset.cpus": "0-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        },
    )


def two_socket_smt() -> Machine:
    """2 sockets x 16 cores x 2 threads, numbered as Linux does: first threads 0-31, second 32-63;
    one node and one L3 per socket; cgroup v2 with no limits."""
    cpus: dict[int, tuple[int, int, int]] = {}
    for thread in (0, 1):
        for socket in (0, 1):
            for core in range(16):
                cpus[thread * 32 + socket * 16 + core] = (socket, socket, core)
    return Machine(
        cpus=cpus,
        node_memory_kb={0: 64 << 20, 1: 64 << 20},
        distances={0: [10, 21], 1: [21, 10]},
        l3=[[c for c, (n, _, _) in cpus.items() if n == s] for s in (0, 1)],
        files={
            "sys/fs/cgroup/cpuset.cpus.effective": "0-63\n",
            "sys/fs/cgroup/cpu.max": "max 100000\n",
        },
    )


def four_nodes_asymmetric() -> Machine:
    """4 nodes of 4 CPUs (no SMT), at distances that differ by pair: 0-1 and 2-3 close, 0-3 far."""
    cpus = {c: (c // 4, c // 4, c % 4) for c in range(16)}
    return Machine(
        cpus=cpus,
        node_memory_kb={n: 16 << 20 for n in range(4)},
        distances={0: [10, 12, 20, 32], 1: [12, 10, 22, 20], 2: [20, 22, 10, 12], 3: [32, 20, 12, 10]},
        l3=[[n * 4 + i for i in range(4)] for n in range(4)],
    )


def container_cpuset_and_quota() -> Machine:
    """A container on an 8-CPU 2-node host: cpuset 2-4 (two CPUs on node 0, one on node 1) and a
    CPU quota of 1.5 (cgroup v2, set on its own cgroup; the parent has none)."""
    cpus = {c: (c // 4, c // 4, c % 4) for c in range(8)}
    leaf = "sys/fs/cgroup/kubepods/pod1/app"
    return Machine(
        cpus=cpus,
        node_memory_kb={0: 8 << 20, 1: 8 << 20},
        distances={0: [10, 21], 1: [21, 10]},
        l3=[[0, 1, 2, 3], [4, 5, 6, 7]],
        affinity=[2, 3, 4],
        cgroup="0::/kubepods/pod1/app\n",
        files={
            f"{leaf}/cpuset.cpus.effective": "2-4\n",
            f"{leaf}/cpu.max": "150000 100000\n",
            "sys/fs/cgroup/kubepods/pod1/cpu.max": "max 100000\n",
        },
    )


def no_numa() -> Machine:
    """A kernel without NUMA folders: 4 CPUs, 2 cores x 2 threads."""
    return Machine(
        cpus={0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 0, 0), 3: (0, 0, 1)},
        node_memory_kb={0: 4 << 20},
        distances={0: [10]},
        l3=[[0, 1, 2, 3]],
        numa_folders=False,
    )
