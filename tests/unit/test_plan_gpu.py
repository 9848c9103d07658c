"""GPU instances in the placement plan (placement/plan.py rule 9): each is one busy host thread
with a CPU of its own, taken before the CPU workers divide the rest, counted in the budget, shared
and said when there is none, refused by a strict plan that would have to share."""

from collections import Counter
from pathlib import Path

import pytest

from lumenrt.engine.config import model_config_from_dict
from lumenrt.engine.gpu import devices
from lumenrt.engine.placing import plan_engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.placement.plan import Demand, PlacementError, Plan, Policy, describe_plan, plan_placement
from lumenrt.placement.topology import Topology, read_topology
from tests.unit import topology_trees as trees


def machine(name: str, tmp_path: Path) -> Topology:
    return read_topology(getattr(trees, name)().write(tmp_path))


def serve(policy: str = "spread", strict: bool = False) -> Policy:
    return Policy.parse(policy, strict=strict, ingress_threads=1)


def given(plan: Plan) -> Counter[int]:
    return Counter(c for m in plan.models for w in m.workers for c in w.cpus) + Counter(plan.ingress_cpus)


@pytest.mark.parametrize("policy", ["spread", "pack"])
def test_gpu_host_threads_get_cpus_of_their_own_and_count_as_busy(policy: str, tmp_path: Path) -> None:
    topo = machine("two_socket_smt", tmp_path)
    demands = [
        Demand("vision", gpus=(0, 0, 1), cpu=False),
        Demand("tabular"),
        Demand("mixed", count=2, gpus=(1,)),
    ]
    plan = plan_placement(topo, demands, serve(policy))
    hosts = [w for m in plan.models for w in m.workers if w.gpu >= 0]
    assert sorted(w.gpu for w in hosts) == [0, 0, 1, 1]
    assert all(w.threads == 1 and len(w.cpus) == 1 for w in hosts)
    assert [w.gpu for w in plan.model("vision").workers] == [0, 0, 1]  # GPU instances only
    mixed = plan.model("mixed").workers
    assert [w.gpu for w in mixed] == [-1, -1, 1] and len(mixed) == 3  # two CPU workers and a feeder
    assert max(given(plan).values()) == 1 and not plan.warnings  # nothing shared
    assert plan.busy_threads == 1 + sum(w.threads for m in plan.models for w in m.workers)
    assert plan.busy_threads <= plan.budget
    assert "(GPU 1)" in describe_plan(plan)
    assert plan.to_json()["models"]["vision"]["workers"][0]["gpu"] == 0


def test_gpu_hosts_come_before_the_cpu_workers_share(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)  # 16 CPUs
    alone = plan_placement(topo, [Demand("cpu")], Policy.parse("spread"))
    beside = plan_placement(
        topo, [Demand("gpu", gpus=(0, 0), cpu=False), Demand("cpu")], Policy.parse("spread")
    )
    assert alone.model("cpu").busy_threads == 16
    assert beside.model("cpu").busy_threads == 14  # what the two feeders left
    assert beside.model("gpu").busy_threads == 2


def test_crowded_machine_shares_and_says_so_and_strict_refuses(tmp_path: Path) -> None:
    topo = machine("this_vm", tmp_path)  # 2 CPUs
    demands = [Demand("squeezenet"), Demand("vision", gpus=(0, 0), cpu=False)]
    plan = plan_placement(topo, demands, serve())
    assert [w.gpu for w in plan.model("vision").workers] == [0, 0]
    assert plan.oversubscribed and any("2 GPU instance(s)" in w for w in plan.warnings)
    with pytest.raises(PlacementError, match="strict placement refuses"):
        plan_placement(topo, demands, serve(strict=True))


def test_feeders_without_a_free_cpu_share_the_least_given(tmp_path: Path) -> None:
    topo = machine("this_vm", tmp_path)
    plan = plan_placement(topo, [Demand("vision", gpus=(0, 0, 0), cpu=False)], Policy.parse("spread"))
    assert sorted(c for w in plan.model("vision").workers for c in w.cpus) == [0, 1, 1]  # ties: the last
    assert plan.warnings == ("vision: 1 of 3 GPU instance thread(s) share a CPU: none was left",)


def test_running_gpu_models_keep_their_host_cpus(tmp_path: Path) -> None:
    topo = machine("two_socket_smt", tmp_path)
    first = plan_placement(topo, [Demand("vision", gpus=(0,), cpu=False)], serve())
    held = {"vision": first.model("vision")}
    later = plan_placement(topo, [Demand("vision", gpus=(0,), cpu=False), Demand("b")], serve(), running=held)
    assert later.model("vision") == first.model("vision")
    assert not set(later.model("vision").workers[0].cpus) & {
        c for w in later.model("b").workers for c in w.cpus
    }


def test_roundrobin_places_one_thread_per_gpu_instance(tmp_path: Path) -> None:
    topo = machine("no_numa", tmp_path)
    plan = plan_placement(topo, [Demand("m", count=2, gpus=(0, 1))], Policy.parse("roundrobin"))
    workers = plan.model("m").workers
    assert [w.gpu for w in workers] == [-1, -1, 0, 1]
    assert [w.threads for w in workers[2:]] == [1, 1]


# ---- the GPU's own NUMA node ------------------------------------------------------------------


def test_a_gpus_host_thread_sits_on_the_gpus_node(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)  # 4 nodes of 4 CPUs
    demands = [Demand("vision", gpus=(0, 1, 1), cpu=False), Demand("cpu")]
    plan = plan_placement(topo, demands, serve(), gpu_nodes={0: 3, 1: 2})
    assert [(w.gpu, w.node) for w in plan.model("vision").workers] == [(0, 3), (1, 2), (1, 2)]
    assert not plan.warnings
    # unknown nodes (-1, or not given): placed as before, by the policy alone
    for nodes in ({0: -1, 1: -1}, {}):
        unknown = plan_placement(topo, demands, serve(), gpu_nodes=nodes)
        assert unknown == plan_placement(topo, demands, serve()) and not unknown.warnings


def test_a_host_thread_off_its_gpus_node_is_said(tmp_path: Path) -> None:
    topo = machine("two_socket_smt", tmp_path)
    plan = plan_placement(topo, [Demand("vision", gpus=(0,), cpu=False)], serve("node:0"), gpu_nodes={0: 1})
    assert [w.node for w in plan.model("vision").workers] == [0]  # the policy's node holds
    assert plan.warnings == (
        "vision: 1 of 1 GPU instance thread(s) run off their GPU's NUMA node: no CPU of the plan was "
        "free there",
    )


def test_the_engine_asks_cuda_and_sysfs_for_each_gpus_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[int]] = []

    def nodes(indices: list[int]) -> dict[int, int]:
        asked.append(list(indices))
        return {0: 3, 1: 2}

    monkeypatch.setattr(devices, "gpu_numa_nodes", nodes)
    config = model_config_from_dict(
        {"backend": "pytorch", "max_batch_size": 8, "instance_group": {"kind": "KIND_GPU", "gpus": [1, 0]}},
        "m/config.yaml",
        "m",
    )
    plan = plan_engine([config], EngineConfig(), topology=machine("four_nodes_asymmetric", tmp_path))
    assert asked == [[0, 1]]
    assert sorted((w.gpu, w.node) for w in plan.model("m").workers) == [(0, 3), (1, 2)]
    # roundrobin does not plan, so it does not ask
    plan_engine([config], EngineConfig(placement="roundrobin"), topology=machine("no_numa", tmp_path))
    assert asked == [[0, 1]]


def test_without_cuda_every_gpus_node_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU build of torch
    assert devices.gpu_numa_nodes([0, 1]) == {0: -1, 1: -1}
