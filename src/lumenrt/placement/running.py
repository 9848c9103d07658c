"""Where a running server's threads and memory are, read from procfs (``lumenrt topology --running``).

For the process ``pid`` and its children (process-mode workers are children of the server):
  - each thread's CPUs (``proc/<pid>/task/<tid>/status`` ``Cpus_allowed_list``);
  - the process's resident memory by node (``proc/<pid>/numa_maps``, placement/memory.py);
  - its locality: the share of that memory on the nodes its threads may run on. A process whose
    threads all run on one node and whose pages are all there reads 100%; a thread-mode server with
    workers on two nodes reads 100% when each page is on one of them (numa_maps counts per process,
    not per thread: a worker's own share is the engine's to report, from what it allocated).
"""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumenrt.placement.memory import read_numa_maps
from lumenrt.placement.topology import Topology, format_cpulist, parse_cpulist

LOCALITY_WARN_BELOW = 0.9  # guessed: under 90% local, a worker pays remote accesses often enough to see


@dataclass(frozen=True, slots=True)
class ProcessPlace:
    pid: int
    command: str
    threads: Counter[tuple[int, ...]]  # CPUs a thread may run on -> threads so
    bytes_by_node: dict[int, int]  # resident memory
    thread_nodes: tuple[int, ...]  # the nodes of those CPUs

    @property
    def local_share(self) -> float | None:
        total = sum(self.bytes_by_node.values())
        local = sum(b for n, b in self.bytes_by_node.items() if n in self.thread_nodes)
        return local / total if total else None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "command": self.command,
            "threads": {format_cpulist(cpus): n for cpus, n in self.threads.items()},
            "bytes_by_node": {str(n): b for n, b in sorted(self.bytes_by_node.items())},
            "thread_nodes": list(self.thread_nodes),
            "local_share": self.local_share,
        }


def children(pid: int, root: Path | str = "/") -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for stat in Path(root, "proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(stat.parent.name))
    return sorted(out)


def place_of(pid: int, topo: Topology, root: Path | str = "/") -> ProcessPlace:
    proc = Path(root, "proc", str(pid))
    threads: Counter[tuple[int, ...]] = Counter()
    for task in sorted(proc.joinpath("task").iterdir()):
        try:
            status = task.joinpath("status").read_text()
        except OSError:
            continue  # the thread ended
        for line in status.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                threads[parse_cpulist(line.split(":", 1)[1], str(task / "status"))] += 1
    by_node: dict[int, int] = {}
    for m in read_numa_maps(pid, root):
        for node, pages in m.pages_by_node.items():
            by_node[node] = by_node.get(node, 0) + pages * m.page_bytes
    cpus = {c for group in threads for c in group}
    nodes = tuple(sorted({topo.node_of(c) for c in cpus if any(x.id == c for x in topo.cpus)}))
    command = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return ProcessPlace(pid, command[:80], threads, by_node, nodes)


def running(pid: int, topo: Topology, root: Path | str = "/") -> list[ProcessPlace]:
    """The process and its children."""
    return [place_of(p, topo, root) for p in [pid, *children(pid, root)]]


def describe_running(places: list[ProcessPlace]) -> str:
    lines = [
        "| pid | threads: CPUs (count) | memory by node, MiB | local | command |",
        "|---|---|---|---|---|",
    ]
    warnings = []
    for p in places:
        threads = ", ".join(f"{format_cpulist(c)} ({n})" for c, n in sorted(p.threads.items()))
        memory = " ".join(f"N{n}={b / 2**20:.0f}" for n, b in sorted(p.bytes_by_node.items()))
        share = p.local_share
        lines.append(
            f"| {p.pid} | {threads} | {memory or '-'} | {'-' if share is None else f'{share:.1%}'} | {p.command} |"
        )
        if share is not None and share < LOCALITY_WARN_BELOW:
            warnings.append(f"warning: process {p.pid}: {share:.1%} of its memory is on its threads' nodes")
    return "\n".join(lines + warnings)
