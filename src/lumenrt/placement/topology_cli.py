"""``lumenrt topology``: what placement sees of this machine (placement/topology.py)."""

import argparse
import sys
from pathlib import Path

from lumenrt.placement.topology import TopologyError, describe, dumps, read_topology


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the topology as JSON")
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


def run_from_args(args: argparse.Namespace) -> int:
    try:
        topo = read_topology(args.root, args.pid)
    except TopologyError as exc:
        print(f"lumenrt topology: {exc}", file=sys.stderr)
        return 2
    print(dumps(topo) if args.json else describe(topo))
    return 0
