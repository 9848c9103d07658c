"""Memory binding and its report (#15), on this machine (one NUMA node, so every page is local and
100% is what a bound worker must read; remote pages need a machine with two nodes): each planned
worker runs under ``bind:<its node>``, reports its share of local memory, in both worker modes; the
metric carries it; ``lumenrt topology --running`` reads a live process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.service import InferenceService
from lumenrt.models.builtin import builtin_examples

MODEL = "digits_mlp"
pytestmark = pytest.mark.skipif(not Path("/proc/self/numa_maps").exists(), reason="needs numa_maps")


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_planned_workers_are_bound_to_their_node_and_read_all_local(mode: str) -> None:
    settings = EngineConfig(worker_mode=mode, lane="queue", placement="spread")
    with Engine(models=[MODEL, "squeezenet"], settings=settings) as engine:
        engine.infer(MODEL, builtin_examples(MODEL, 1))
        report = engine.placement_report()
        workers = [w for versions in report.values() for ws in versions.values() for w in ws]
        assert len(workers) >= 2
        for w in workers:
            assert w["node"] == 0 and w["pid"] > 0
            assert w["memory_policy"] == "bind:0", w
            assert w["local_share"] == 1.0, w
            # the model's region (rings, arena, table): bound before first use, read in the worker's
            # view (process mode: the worker's own mapping of the shared region)
            assert w["region_node"] == 0 and w["region_local_share"] == 1.0, w
        # the same report in the model statistics (GET /v2/models/<name>/stats, "lumenrt")
        (stats,) = InferenceService(engine).statistics(MODEL)["model_stats"]
        assert [w["memory_policy"] for w in stats["lumenrt"]["placement"]] == ["bind:0"] * len(
            report[MODEL][1]
        )


def test_first_touch_pins_without_a_memory_policy() -> None:
    settings = EngineConfig(lane="queue", placement="spread", memory_binding="first_touch")
    with Engine(models=[MODEL], settings=settings) as engine:
        engine.infer(MODEL, builtin_examples(MODEL, 1))
        (worker,) = engine.placement_report()[MODEL][1]
        assert worker["cpus"] == sorted(os.sched_getaffinity(0))
        assert (worker["memory_policy"], worker["local_share"]) == ("default", 1.0)  # one node: all local


def test_roundrobin_pins_without_binding_as_before_planning() -> None:
    settings = EngineConfig(lane="queue", placement="roundrobin")
    with Engine(models=[MODEL], settings=settings) as engine:
        (worker,) = engine.placement_report()[MODEL][1]
        assert (worker["node"], worker["memory_policy"], worker["region_node"]) == (0, "default", -1)


def test_unpinned_workers_are_not_bound() -> None:
    settings = EngineConfig(lane="queue", pin=False)
    with Engine(models=[MODEL], settings=settings) as engine:
        (worker,) = engine.placement_report()[MODEL][1]
        assert (worker["cpus"], worker["node"], worker["memory_policy"], worker["local_share"]) == (
            [],
            -1,
            None,
            None,
        )


def test_topology_running_reads_a_live_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lumenrt.cli", "topology", "--running", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (row,) = [line for line in out.splitlines() if line.startswith(f"| {os.getpid()} |")]
    assert "100.0%" in row and "N0=" in row
    missing = subprocess.run(
        [sys.executable, "-m", "lumenrt.cli", "topology", "--running", "999999999"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "--running 999999999" in missing.stderr
