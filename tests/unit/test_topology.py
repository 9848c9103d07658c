"""The topology placement reads (placement/topology.py), on a fake sysfs/procfs tree per machine
(tests/unit/topology_trees.py) and on this machine; and ``lumenrt topology`` printing it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lumenrt.placement.topology import (
    TopologyError,
    describe,
    format_cpulist,
    parse_cpulist,
    pci_numa_node,
    read_topology,
)
from tests.unit import topology_trees as trees


def test_cpulists_parse_as_the_kernel_writes_them() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("") == ()
    assert parse_cpulist("5") == (5,)
    with pytest.raises(TopologyError, match="not a CPU list"):
        parse_cpulist("0-a")
    with pytest.raises(TopologyError, match="backwards"):
        parse_cpulist("3-1")
    for cpus in [(), (0,), (0, 1, 2, 5), (1, 3, 5), tuple(range(64))]:
        assert parse_cpulist(format_cpulist(cpus)) == cpus  # what the fake trees write reads back
    assert format_cpulist((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_this_vm(tmp_path: Path) -> None:
    topo = read_topology(trees.this_vm().write(tmp_path))
    assert [(n.id, n.cpus, n.memory_bytes, n.distances) for n in topo.nodes] == [
        (0, (0, 1), 9135904 * 1024, (10,))
    ]
    assert topo.physical_cores == [(0,), (1,)]
    assert {c.l3 for c in topo.cpus} == {(0, 1)}
    assert (topo.cgroup_version, topo.cpuset, topo.quota_cpus) == (1, (0, 1), None)
    assert (topo.usable_cpus, topo.busy_threads) == ((0, 1), 2)


def test_two_sockets_with_smt(tmp_path: Path) -> None:
    topo = read_topology(trees.two_socket_smt().write(tmp_path))
    assert [n.cpus for n in topo.nodes] == [
        tuple(range(0, 16)) + tuple(range(32, 48)),
        tuple(range(16, 32)) + tuple(range(48, 64)),
    ]
    assert [n.distances for n in topo.nodes] == [(10, 21), (21, 10)]
    cores = topo.physical_cores
    assert len(cores) == 32 and (0, 32) in cores and (17, 49) in cores  # siblings together
    cpu = next(c for c in topo.cpus if c.id == 40)
    assert (cpu.node, cpu.package, cpu.core, cpu.siblings) == (0, 0, 8, (8, 40))
    assert len({c.l3 for c in topo.cpus}) == 2  # one L3 per socket
    assert (topo.cgroup_version, topo.quota_cpus, topo.busy_threads) == (2, None, 64)


def test_four_nodes_at_asymmetric_distances(tmp_path: Path) -> None:
    topo = read_topology(trees.four_nodes_asymmetric().write(tmp_path))
    assert [n.cpus for n in topo.nodes] == [tuple(range(4 * n, 4 * n + 4)) for n in range(4)]
    assert topo.nodes[0].distances == (10, 12, 20, 32) and topo.nodes[3].distances == (32, 20, 12, 10)
    assert [topo.node_of(c) for c in (0, 5, 10, 15)] == [0, 1, 2, 3]
    assert topo.cgroup_version == 2 and topo.busy_threads == 16  # a v2 root with no limit files


def test_a_container_with_a_cpuset_across_nodes_and_a_quota_of_one_and_a_half(tmp_path: Path) -> None:
    topo = read_topology(trees.container_cpuset_and_quota().write(tmp_path))
    assert topo.cpuset == (2, 3, 4) and topo.usable_cpus == (2, 3, 4)
    assert sorted({topo.node_of(c) for c in topo.usable_cpus}) == [0, 1]  # the cpuset spans both nodes
    assert topo.quota_cpus == 1.5
    assert topo.busy_threads == 1  # the quota, rounded down: 1.5 CPUs keep one thread busy
    text = describe(topo)
    assert "quota: 1.5 CPUs" in text and "busy threads at most: 1" in text


def test_the_affinity_narrows_the_cpuset_and_a_tighter_ancestor_quota_wins(tmp_path: Path) -> None:
    machine = trees.container_cpuset_and_quota()
    machine.affinity = [3]
    machine.files["sys/fs/cgroup/kubepods/pod1/cpu.max"] = "50000 100000\n"
    topo = read_topology(machine.write(tmp_path))
    assert topo.usable_cpus == (3,) and topo.quota_cpus == 0.5 and topo.busy_threads == 1


def test_a_kernel_without_numa_is_one_node(tmp_path: Path) -> None:
    topo = read_topology(trees.no_numa().write(tmp_path))
    assert [(n.id, n.cpus, n.memory_bytes) for n in topo.nodes] == [(0, (0, 1, 2, 3), (4 << 20) * 1024)]
    assert topo.physical_cores == [(0, 2), (1, 3)]
    assert topo.cgroup_version == 2


def test_isolated_cpus_are_reported(tmp_path: Path) -> None:
    machine = trees.four_nodes_asymmetric()
    machine.isolated = [14, 15]
    machine.affinity = list(range(14))
    topo = read_topology(machine.write(tmp_path))
    assert topo.isolated == (14, 15) and topo.usable_cpus == tuple(range(14))


def test_a_file_that_says_nonsense_is_named(tmp_path: Path) -> None:
    machine = trees.container_cpuset_and_quota()
    machine.files["sys/fs/cgroup/kubepods/pod1/app/cpu.max"] = "lots\n"
    with pytest.raises(TopologyError, match=r"app/cpu\.max: 'lots'"):
        read_topology(machine.write(tmp_path))
    with pytest.raises(TopologyError, match="online: missing"):
        read_topology(tmp_path / "nowhere")


def test_a_pci_devices_numa_node_is_read_and_anything_else_is_unknown(tmp_path: Path) -> None:
    devices = tmp_path / "sys/bus/pci/devices"
    for address, text in (("0000:3b:00.0", "1\n"), ("0000:af:00.0", "-1\n"), ("0000:d8:00.0", "x\n")):
        (devices / address).mkdir(parents=True)
        (devices / address / "numa_node").write_text(text)
    assert pci_numa_node("0000:3b:00.0", tmp_path) == 1
    assert pci_numa_node(" 0000:3B:00.0\n", tmp_path) == 1  # as a driver may print it
    assert pci_numa_node("0000:af:00.0", tmp_path) == -1  # a kernel without NUMA says -1
    assert pci_numa_node("0000:d8:00.0", tmp_path) == -1  # unreadable: unknown, not an error
    assert pci_numa_node("0000:00:01.0", tmp_path) == -1  # no such device
    for not_an_address in ("../../../etc", "0000:3b:00.0/../..", "", "3b:00.0"):
        assert pci_numa_node(not_an_address, tmp_path) == -1  # never read as a path


def test_this_machine_matches_what_the_os_says() -> None:
    topo = read_topology("/", os.getpid())
    assert set(topo.usable_cpus) == os.sched_getaffinity(0)
    assert len(topo.cpus) <= (os.cpu_count() or 0)
    assert 1 <= topo.busy_threads <= len(topo.usable_cpus)
    assert sorted(c for n in topo.nodes for c in n.cpus) == [c.id for c in topo.cpus]


def test_the_command_prints_a_table_or_json(tmp_path: Path) -> None:
    root = trees.container_cpuset_and_quota().write(tmp_path)
    cmd = [sys.executable, "-m", "lumenrt.cli", "topology", "--root", str(root)]
    table = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "| 1 | 4-7 | 4 |" in table and "busy threads at most: 1" in table
    assert "idle CPUs: not reported" in table  # the fake tree has no cpuidle driver
    doc = json.loads(
        subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True, timeout=60).stdout
    )
    assert doc["usable_cpus"] == [2, 3, 4] and doc["quota_cpus"] == 1.5
    assert doc["cpu_idle"] == {"driver": None, "governor": None, "guest_halt_poll_ns": None, "states": []}
    bad = subprocess.run(
        [*cmd[:-2], "--root", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "lumenrt topology:" in bad.stderr and "Traceback" not in bad.stderr


def test_the_command_prints_the_serve_plan_for_a_machine(tmp_path: Path) -> None:
    """``--plan``: the built-in repository's configs (nothing loaded) on a fake machine."""
    root = trees.two_socket_smt().write(tmp_path / "box")
    cmd = [sys.executable, "-m", "lumenrt.cli", "topology", "--root", str(root), "--plan"]
    doc = json.loads(
        subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True, timeout=120).stdout
    )
    assert (doc["budget"], doc["oversubscribed"], doc["ingress_cpus"]) == (64, False, [47])
    assert sorted(doc["models"]) == ["digits_mlp", "squeezenet", "tabular_xgb"]
    table = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    assert "policy spread; busy threads 64 of 64" in table
    refused = subprocess.run([*cmd, "--placement", "node:7"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "node:7: no such NUMA node" in refused.stderr
