"""``lumenrt topology``: what placement sees of this machine (placement/topology.py), the plan
``lumenrt serve`` would make of it for a repository and config (``--plan``, placement/plan.py via
engine/placing.py: configs are read, no model is loaded), and where a running server's threads and
memory are (``--running PID``, placement/running.py)."""

import argparse
import json
import sys
from pathlib import Path

from lumenrt.placement.cpu_idle import describe_idle, read_cpu_idle
from lumenrt.placement.topology import Topology, TopologyError, describe, read_topology


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="read sysfs and procfs below this folder instead of / (a copied or fake tree)",
    )
    p.add_argument(
        "--pid",
        default="self",
        help="the process whose affinity and cgroup count (default: this one; with --root, the "
        "folder name under proc/)",
    )
    plan = p.add_argument_group(
        "the plan lumenrt serve would use (from the config's engine section and these flags; its "
        "server section is not read)"
    )
    plan.add_argument("--plan", action="store_true", help="print the placement plan for the repository")
    plan.add_argument("--repository", type=Path, help="model repository (default: the built-in models)")
    plan.add_argument("--models", nargs="+", metavar="NAME", help="only these models (default: all)")
    plan.add_argument("--config", type=Path, help="server config file (its 'engine' section)")
    plan.add_argument("--placement", metavar="POLICY", help="spread | pack | node:N | roundrobin")
    plan.add_argument("--workers", type=int, help="as lumenrt serve --workers (placement roundrobin)")
    plan.add_argument(
        "--placement-strict",
        action="store_true",
        default=None,
        help="as lumenrt serve --placement-strict: refuse a plan that must shrink or share",
    )
    plan.add_argument(
        "--ingress-threads", type=int, default=1, help="front-end threads to count (lumenrt serve: 1)"
    )
    p.add_argument(
        "--running",
        type=int,
        metavar="PID",
        help="a running server (its pid): each process's threads' CPUs and memory by node, and "
        "the share of its memory on its threads' nodes",
    )


def run_from_args(args: argparse.Namespace) -> int:
    try:
        topo = read_topology(args.root, args.pid)
    except TopologyError as exc:
        print(f"lumenrt topology: {exc}", file=sys.stderr)
        return 2
    if args.running is not None:
        return _running(args, topo)
    if args.plan:
        return _plan(args)
    idle = read_cpu_idle(args.root)  # how idle CPUs sleep: a VM's wake-ups (placement/cpu_idle.py)
    if args.json:
        print(json.dumps({**topo.to_json(), "cpu_idle": idle.as_dict()}, indent=1))
    else:
        print(describe(topo) + "\n" + describe_idle(idle))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from lumenrt.engine.config import ConfigError
    from lumenrt.engine.placing import engine_topology, plan_engine
    from lumenrt.engine.repository import ModelRepository
    from lumenrt.engine.server_config import load_engine_config
    from lumenrt.placement.plan import PlacementError, describe_plan

    try:
        settings = load_engine_config(
            args.config,
            {
                "placement": args.placement,
                "thread_count": args.workers,
                "placement_strict": args.placement_strict,
            },
        )
        if args.repository is None:  # the models lumenrt serve would load from the built-in repository
            from lumenrt.models.int8 import builtin_models

            args.repository, args.models = builtin_models(args.models)
        repo = ModelRepository(args.repository)
        names = args.models or [m.name for m in repo.index()]
        configs = [repo.config(name) for name in names]
        topo = engine_topology(settings, str(args.root))
        plan = plan_engine(configs, settings, args.ingress_threads, topology=topo)
    except (ConfigError, PlacementError, TopologyError, OSError, LookupError) as exc:
        print(f"lumenrt topology: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_json(), indent=1) if args.json else describe_plan(plan))
    return 0


def _running(args: argparse.Namespace, topo: "Topology") -> int:
    from lumenrt.placement.memory import LocalityError
    from lumenrt.placement.running import describe_running, running

    try:
        places = running(args.running, topo, args.root)
    except (OSError, LocalityError, TopologyError) as exc:
        print(f"lumenrt topology: --running {args.running}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps([p.to_json() for p in places], indent=1) if args.json else describe_running(places))
    return 0
