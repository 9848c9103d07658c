"""The placement plan (placement/plan.py) on every fake machine of tests/unit/topology_trees.py:
the built-in models' demands (squeezenet and tabular_xgb one instance per CPU, digits_mlp one
instance) with ``lumenrt serve``'s one ingress thread, and the refusals."""

from collections import Counter
from pathlib import Path

import pytest

from lumenrt.placement.plan import (
    Demand,
    PlacementError,
    Plan,
    Policy,
    describe_plan,
    plan_placement,
)
from lumenrt.placement.topology import Topology, read_topology
from tests.unit import topology_trees as trees

BUILTIN = [Demand("squeezenet"), Demand("digits_mlp", count=1), Demand("tabular_xgb")]
MACHINES = ["this_vm", "two_socket_smt", "four_nodes_asymmetric", "container_cpuset_and_quota", "no_numa"]


def machine(name: str, tmp_path: Path) -> Topology:
    return read_topology(getattr(trees, name)().write(tmp_path))


def serve(policy: str = "spread", strict: bool = False) -> Policy:
    return Policy.parse(policy, strict=strict, ingress_threads=1)


def cpus_of(plan: Plan, model: str) -> list[tuple[int, ...]]:
    return [w.cpus for w in plan.model(model).workers]


@pytest.mark.parametrize("policy", ["spread", "pack"])
@pytest.mark.parametrize("name", MACHINES)
def test_a_plan_is_within_budget_or_says_why(name: str, policy: str, tmp_path: Path) -> None:
    topo = machine(name, tmp_path)
    plan = plan_placement(topo, BUILTIN, serve(policy))
    given = Counter(c for m in plan.models for w in m.workers for c in w.cpus) + Counter(plan.ingress_cpus)
    assert set(given) <= set(topo.usable_cpus)
    for m in plan.models:
        for w in m.workers:
            assert w.threads == len(w.cpus) >= 1  # one compute thread per CPU
            assert {topo.node_of(c) for c in w.cpus} == {w.node}  # a worker's CPUs on its memory's node
        assert m.shared == any(given[c] > 1 for w in m.workers for c in w.cpus)
    if plan.oversubscribed:  # only ever with a warning saying who shares
        says = ("no CPU left", "round-robin over all of them", "also run workers")
        assert any(s in w for w in plan.warnings for s in says)
        if any("also run workers" in w for w in plan.warnings):  # strict keeps the ingress's CPU its own
            strict = plan_placement(topo, BUILTIN, serve(policy, strict=True))
            assert not strict.oversubscribed and strict.warnings == ()
        else:
            with pytest.raises(PlacementError, match="strict placement refuses"):
                plan_placement(topo, BUILTIN, serve(policy, strict=True))
    else:
        assert max(given.values()) == 1  # nothing shared
        assert plan.busy_threads <= topo.busy_threads
    assert plan_placement(topo, BUILTIN, serve(policy)) == plan  # a function of its inputs
    assert "busy threads" in describe_plan(plan)


def test_this_vm_places_crowded_models_round_robin_and_says_so(tmp_path: Path) -> None:
    """Two CPUs for three models and the event loop: no CPU can be the loop's alone, so each
    model's instances (one per CPU, digits_mlp's one) go round-robin over both CPUs; seven busy
    threads on two CPUs, said in a warning. Without an ingress thread (the in-process engine) the
    models in order get CPU 0 and 1, and the third shares the least used one."""
    topo = machine("this_vm", tmp_path)
    plan = plan_placement(topo, BUILTIN, serve())
    assert plan.ingress_cpus == ()
    assert [cpus_of(plan, m) for m in ("squeezenet", "digits_mlp", "tabular_xgb")] == [
        [(0,), (1,)],
        [(0, 1)],
        [(0,), (1,)],
    ]
    assert all(m.shared for m in plan.models)
    assert (plan.busy_threads, plan.budget, plan.oversubscribed) == (7, 2, True)
    (warning,) = plan.warnings
    assert "3 model(s) and 1 ingress thread(s) need more than the 2 CPU(s)" in warning
    engine = plan_placement(topo, BUILTIN, Policy.parse("spread"))
    assert [cpus_of(engine, m) for m in ("squeezenet", "digits_mlp", "tabular_xgb")] == [
        [(0,)],
        [(1,)],
        [(1,)],
    ]
    assert [m.shared for m in engine.models] == [False, True, True]
    assert any("tabular_xgb: no CPU left" in w for w in engine.warnings)
    # A lone model keeps both CPUs, as round-robin gives them (a CPU of the event loop's own would
    # halve a heavy model's compute); the loop shares CPU 1 with a worker, and the plan says so.
    one = plan_placement(topo, [Demand("squeezenet")], serve())
    assert (one.ingress_cpus, cpus_of(one, "squeezenet")) == ((1,), [(0,), (1,)])
    assert one.model("squeezenet").shared and one.oversubscribed
    (warning,) = one.warnings
    assert "ingress CPU(s) 1 also run workers" in warning and "1/10 of the 2 CPU(s)" in warning
    strict = plan_placement(topo, [Demand("squeezenet")], serve(strict=True))
    assert (strict.ingress_cpus, cpus_of(strict, "squeezenet"), strict.warnings) == ((1,), [(0,)], ())


def test_two_sockets_use_whole_cores_first_and_spread_over_both(tmp_path: Path) -> None:
    topo = machine("two_socket_smt", tmp_path)
    spread = plan_placement(topo, BUILTIN, serve())
    assert (spread.busy_threads, spread.oversubscribed, spread.warnings) == (64, False, ())
    assert spread.ingress_cpus == (47,)  # node 0's last choice: an SMT sibling
    squeezenet = spread.model("squeezenet").workers
    assert len(squeezenet) == 21 and all(w.threads == 1 for w in squeezenet)
    assert all(w.cpus[0] < 32 for w in squeezenet)  # first threads of physical cores only
    assert Counter(w.node for w in squeezenet) == {0: 10, 1: 11}  # both sockets serve
    pack = plan_placement(topo, BUILTIN, serve("pack"))
    assert {w.node for w in pack.model("squeezenet").workers} == {0}
    (digits,) = spread.model("digits_mlp").workers  # count 1: one instance, its share's threads, one node
    assert digits.threads == len(digits.cpus) == 21 and len({topo.node_of(c) for c in digits.cpus}) == 1


def test_four_nodes_spread_node_policy_and_numa_node(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)
    spread = plan_placement(topo, [Demand("a", count=4)], Policy.parse("spread"))
    assert sorted(w.node for w in spread.model("a").workers) == [0, 1, 2, 3]
    assert all(w.threads == 4 for w in spread.model("a").workers)
    on2 = plan_placement(topo, BUILTIN, serve("node:2"))
    used = {c for m in on2.models for w in m.workers for c in w.cpus} | set(on2.ingress_cpus)
    assert used == {8, 9, 10, 11}
    tied = plan_placement(topo, [Demand("a"), Demand("b", node=3)], Policy.parse("spread"))
    assert {c for c in (cpu for cpus in cpus_of(tied, "b") for cpu in cpus)} <= {12, 13, 14, 15}
    assert all(w.node == 3 for w in tied.model("b").workers)


def test_a_container_quota_caps_the_cpus_used(tmp_path: Path) -> None:
    """cpuset 2-4 (two nodes) with a quota of 1.5 CPUs: one busy thread at most."""
    topo = machine("container_cpuset_and_quota", tmp_path)
    plan = plan_placement(topo, [Demand("m")], Policy.parse("spread"))
    assert (cpus_of(plan, "m"), plan.busy_threads, plan.warnings) == ([(2,)], 1, ())
    with pytest.raises(PlacementError, match="strict"):
        plan_placement(topo, [Demand("m"), Demand("n")], Policy.parse("spread", strict=True))


def test_no_numa_prefers_whole_cores(tmp_path: Path) -> None:
    plan = plan_placement(machine("no_numa", tmp_path), [Demand("a"), Demand("b")], Policy.parse("spread"))
    # CPUs 0 and 1 are the first threads of the two cores, 2 and 3 their siblings: the first
    # model's two instances get a core each, the second the siblings
    assert [cpus_of(plan, m) for m in ("a", "b")] == [[(0,), (1,)], [(2,), (3,)]]
    two = plan_placement(machine("no_numa", tmp_path), [Demand("a", count=1), Demand("b", count=1)], Policy())
    assert [cpus_of(two, m) for m in ("a", "b")] == [[(0, 1)], [(2, 3)]]


@pytest.mark.parametrize(
    ("demands", "policy", "message"),
    [
        ([Demand("a", cores=(2, 7))], "spread", r"a: instance_group.cores\[1\] = 7 is not usable"),
        ([Demand("a", cores=(2,)), Demand("b", cores=(2, 3))], "spread", r"b: .*= 2 is also given to a"),
        ([Demand("a", node=5)], "spread", "numa_node 5: no such node"),
        ([Demand("a")], "node:9", "node:9: no such NUMA node"),
    ],
)
def test_what_cannot_be_honoured_is_refused(
    demands: list[Demand], policy: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(PlacementError, match=message):
        plan_placement(machine("container_cpuset_and_quota", tmp_path), demands, Policy.parse(policy))


def test_a_node_without_usable_cpus_is_refused(tmp_path: Path) -> None:
    box = trees.container_cpuset_and_quota()
    box.affinity = [2, 3]  # node 1's only CPU of the cpuset (4) is outside the affinity
    topo = read_topology(box.write(tmp_path))
    with pytest.raises(PlacementError, match="numa_node 1: the node has no CPU"):
        plan_placement(topo, [Demand("a", node=1)], Policy.parse("spread"))
    with pytest.raises(PlacementError, match="node:1: the node has no CPU"):
        plan_placement(topo, [Demand("a")], Policy.parse("node:1"))
    with pytest.raises(PlacementError, match="numa_node 0 is outside policy node:1"):
        plan_placement(
            machine("container_cpuset_and_quota", tmp_path / "b"),
            [Demand("a", node=0)],
            Policy.parse("node:1"),
        )


def test_explicit_cores_are_split_between_instances(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)
    plan = plan_placement(
        topo, [Demand("a", cores=(4, 5, 6, 7), count=2), Demand("b")], Policy.parse("spread")
    )
    assert [(w.cpus, w.threads, w.node) for w in plan.model("a").workers] == [((4, 5), 2, 1), ((6, 7), 2, 1)]
    assert not {4, 5, 6, 7} & {c for cpus in cpus_of(plan, "b") for c in cpus}
    too_many = plan_placement(topo, [Demand("a", cores=(4,), count=3)], Policy.parse("spread"))
    assert len(too_many.model("a").workers) == 1 and "3 instances asked" in too_many.warnings[0]


def test_roundrobin_is_the_placement_before_planning(tmp_path: Path) -> None:
    plan = plan_placement(machine("this_vm", tmp_path), BUILTIN, serve("roundrobin"))
    assert [cpus_of(plan, m) for m in ("squeezenet", "digits_mlp", "tabular_xgb")] == [
        [(0,), (1,)],
        [(0, 1)],
        [(0,), (1,)],
    ]
    assert plan.oversubscribed and plan.busy_threads == 1 + 2 + 2 + 2


@pytest.mark.parametrize("text", ["nodes", "node:", "node:x", "SPREAD"])
def test_a_bad_policy_is_named(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text)):
        Policy.parse(text)


def test_explicit_cores_are_taken_before_the_ingress(tmp_path: Path) -> None:
    """no_numa: CPUs 0-3, 3 the ingress's usual pick; a model claiming CPU 3 keeps it alone (strict:
    the ingress keeps its CPU to itself on this small machine too)."""
    topo = machine("no_numa", tmp_path)
    plan = plan_placement(topo, [Demand("a", cores=(3,)), Demand("b")], serve(strict=True))
    assert 3 not in plan.ingress_cpus and plan.ingress_cpus
    assert cpus_of(plan, "a") == [(3,)] and not plan.model("a").shared
    assert not {3, *plan.ingress_cpus} & {c for cpus in cpus_of(plan, "b") for c in cpus}
    assert not plan.oversubscribed and plan.warnings == ()


def test_explicit_cores_over_the_quota_are_said_or_refused(tmp_path: Path) -> None:
    topo = machine("container_cpuset_and_quota", tmp_path)  # a quota of one busy thread
    plan = plan_placement(topo, [Demand("a", cores=(3, 4))], Policy.parse("spread"))
    assert plan.oversubscribed and any("busy threads" in w for w in plan.warnings)
    with pytest.raises(PlacementError, match="strict"):
        plan_placement(topo, [Demand("a", cores=(3, 4))], Policy.parse("spread", strict=True))


def test_models_tied_to_one_node_share_it_fairly(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)  # 4 CPUs a node
    plan = plan_placement(
        topo, [Demand("a", node=1), Demand("b", node=1)], Policy.parse("spread", strict=True)
    )
    assert [sorted(c for cpus in cpus_of(plan, m) for c in cpus) for m in ("a", "b")] == [[4, 5], [6, 7]]


def test_the_crowded_case_keeps_a_tied_model_inside_the_policy(tmp_path: Path) -> None:
    topo = machine("container_cpuset_and_quota", tmp_path)
    with pytest.raises(PlacementError, match="numa_node 1 is outside policy node:0"):
        plan_placement(topo, [Demand("a", node=1), Demand("b")], Policy.parse("node:0", ingress_threads=1))


def test_roundrobin_says_when_it_is_over_budget_and_keeps_numa_node(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)
    plan = plan_placement(topo, [Demand("a"), Demand("b", node=2)], serve("roundrobin"))
    assert plan.oversubscribed and any("busy threads" in w for w in plan.warnings)
    assert {c for cpus in cpus_of(plan, "b") for c in cpus} == {8, 9, 10, 11}
    with pytest.raises(PlacementError, match="strict"):
        plan_placement(topo, [Demand("a"), Demand("b")], serve("roundrobin", strict=True))


def test_cores_off_their_numa_node_are_refused(tmp_path: Path) -> None:
    topo = machine("four_nodes_asymmetric", tmp_path)
    with pytest.raises(PlacementError, match=r"a: instance_group.cores\[1\] = 4 is not on node 0"):
        plan_placement(topo, [Demand("a", cores=(0, 4), node=0)], Policy.parse("spread"))


def test_models_already_running_keep_their_cpus(tmp_path: Path) -> None:
    """A model loaded later is planned around the running ones' CPUs, which do not move."""
    topo = machine("four_nodes_asymmetric", tmp_path)
    first = plan_placement(topo, [Demand("a")], Policy.parse("spread"))
    held = {"a": first.model("a")}
    later = plan_placement(topo, [Demand("a"), Demand("b")], Policy.parse("spread"), running=held)
    assert later.model("a").workers == first.model("a").workers  # all 16 CPUs: b must share, and says so
    assert later.model("b").shared and any("b: no CPU left" in w for w in later.warnings)
    half = plan_placement(topo, [Demand("a", count=2, node=0)], Policy.parse("spread"))
    both = plan_placement(
        topo,
        [Demand("a", count=2, node=0), Demand("b")],
        Policy.parse("spread"),
        running={"a": half.model("a")},
    )
    assert both.model("a").workers == half.model("a").workers
    assert not {c for w in half.model("a").workers for c in w.cpus} & {
        c for cpus in cpus_of(both, "b") for c in cpus
    }


@pytest.mark.parametrize("name", MACHINES)
def test_a_lone_model_gets_at_least_nine_tenths_of_what_round_robin_gives_it(
    name: str, tmp_path: Path
) -> None:
    """Rule 6 on every fake machine (this VM, two sockets, four uneven nodes, a container, no NUMA):
    the CPUs a lone model's workers run on under the default plan, with the event loop, against
    round-robin's (both within the quota's busy threads)."""
    topo = machine(name, tmp_path)
    for policy in ("spread", "pack"):
        plan = plan_placement(topo, [Demand("m")], serve(policy))
        rr = plan_placement(topo, [Demand("m")], serve("roundrobin"))
        planned = {c for cpus in cpus_of(plan, "m") for c in cpus}
        robin = {c for cpus in cpus_of(rr, "m") for c in cpus}
        assert len(planned) >= 0.9 * min(len(robin), topo.busy_threads), (policy, planned, robin)
        if plan.model("m").shared:  # the ingress shares a CPU with a worker: said
            assert any("also run workers" in w for w in plan.warnings)
