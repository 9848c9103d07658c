"""The ``lumenrt`` command.

Every subcommand is one row of ``COMMANDS``: its help text, where its arguments and its body live
(``"module:function"``), and the extra it needs. Only the subcommand being run is imported, first
for its arguments (modules that import core packages only, so its ``--help`` works on a plain
install), then for its body, after ``extras.require`` has checked its extra. A missing extra is
one line on stderr and exit status 2, never a traceback; so is a former subcommand (``MOVED``),
whose line names the script in ``benchmarks/`` that replaces it.
"""

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lumenrt.extras import MissingExtra, extra_providing, require

AddArguments = Callable[[argparse.ArgumentParser], None]
RunFromArgs = Callable[[argparse.Namespace], int]


@dataclass(frozen=True, slots=True)
class Command:
    words: tuple[str, ...]  # ("bench", "load") for `lumenrt bench load`
    help: str
    description: str
    arguments: str | AddArguments  # "module:function" (imported only for this command) or a function
    run: str | RunFromArgs
    extra: str | None = None  # the extra it needs to run (its --help works without it)
    needs: tuple[str, ...] = ()  # the modules of that extra it needs (default: all of them)


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=20000, help="requests to send (default 20000)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--queue-type", default="mpmc", choices=["mpmc", "naive", "batched"])


def _run_demo(args: argparse.Namespace) -> int:
    from lumenrt.demo import run_demo

    return run_demo(requests=args.requests, workers=args.workers, queue_type=args.queue_type)


COMMANDS: tuple[Command, ...] = (
    Command(
        ("serve",),
        "serve a model repository over KServe V2 HTTP and gRPC and the binary TCP protocol",
        "Serve a model repository (default: the built-in models) over KServe V2 HTTP/REST "
        "(tritonclient.http, perf_analyzer), KServe V2 gRPC (tritonclient.grpc) and lumenrt's binary "
        "TCP protocol (lumenrt.client). Prints where it listens, then 'ready'.",
        "lumenrt.ingress.serve:add_arguments",
        "lumenrt.ingress.serve:run_from_args",
    ),
    Command(
        ("topology",),
        "show the machine as placement sees it, the plan lumenrt serve would make, a live server's places",
        "Read sysfs and procfs (no root needed): NUMA nodes with their CPUs, memory and distances, "
        "physical cores and SMT siblings, the CPUs sharing each L3, this process's affinity, its "
        "cgroup's cpuset and CPU quota, isolated CPUs; then the CPUs placement may use and how many "
        "threads it may keep busy at once. --plan: the placement plan lumenrt serve would use for a "
        "repository and config (which CPUs, threads and memory node each model's workers get; nothing "
        "is loaded). --running PID: a live server's threads' CPUs and memory by node. --json for a "
        "machine-readable form.",
        "lumenrt.topology_cli:add_arguments",
        "lumenrt.topology_cli:run_from_args",
    ),
    Command(
        ("quantize",),
        "INT8-quantize an ONNX model and report size, speed and agreement against FP32",
        "Quantize an ONNX model (a file, or builtin:NAME) to INT8 with ONNX Runtime's tools: dynamic "
        "for MLP-like graphs, static QDQ calibrated on samples for convolutional ones, per-channel where "
        "supported. Then report what to know before trusting it: FP32 and INT8 model sizes, latency "
        "p50/p99 and throughput at batch 1 and at the preferred batch, and on held-out samples the top-1 "
        "agreement, the max absolute error and, where there are labels, the accuracy of both.",
        "lumenrt.quantize.cli:add_arguments",
        "lumenrt.quantize.cli:run_from_args",
    ),
    Command(
        ("demo",),
        "run a short demo of the native core (ring + arena across processes)",
        "Start worker processes that answer requests passed through a shared-memory MPMC ring and "
        "slab arena, and print the round-trip latency. Sends only in-process/IPC traffic; stops by itself.",
        _demo_arguments,
        _run_demo,
    ),
    Command(
        ("bench", "load"),
        "the load generator: closed or open loop against a running server (TCP, HTTP, gRPC)",
        "Drive one model of a running server from this process (or --processes more): closed loop "
        "(--concurrency clients) or open loop (--rate, constant or Poisson arrivals, latency measured "
        "from the intended send time). Prints HdrHistogram percentiles, throughput and errors by kind; "
        "writes a per-request CSV and a summary JSON (machine, commit, server config, load config). "
        "`lumenrt bench --target ...` is short for `lumenrt bench load --target ...`.",
        "lumenrt.bench.load_cli:add_arguments",
        "lumenrt.bench.load_cli:run_from_args",
    ),
    Command(
        ("bench", "matrix"),
        "the architecture table: queue x allocator x worker mode x batch size, each served and loaded",
        "For each configuration, start `lumenrt serve` with it, drive SqueezeNet at a fixed offered rate "
        "(open loop) and at saturation (closed loop), and stop it; in the same run measure the raw limit "
        "(ONNX Runtime in-process, same cores) so every row has a ratio to it. Prints the table "
        "(throughput, p50, p99, p99.9, mean compute) and writes it.",
        "lumenrt.bench.matrix:add_arguments",
        "lumenrt.bench.matrix:run_from_args",
    ),
    Command(
        ("bench", "report"),
        "write the dashboard's plots for result files as one static HTML file (no server)",
        "Read result files (load, matrix, peers) from a results folder and write one self-contained "
        "HTML file with the dashboard's plots (plotly.js inline, works offline).",
        "lumenrt.dashboard.report_cli:add_arguments",
        "lumenrt.dashboard.report_cli:run_from_args",
        extra="dashboard",
        needs=("plotly",),
    ),
    Command(
        ("dashboard",),
        "open the Streamlit dashboard over a results folder",
        "Start a Streamlit app on 127.0.0.1 over the result files in RESULTS_DIR (default results/): "
        "latency over time, throughput over time, percentiles and CDF, time per stage, and runs side by "
        "side (architecture matrix, peer table). With --live URL, instead: a running server's metrics "
        "scraped every second, plotted per model (throughput, p50/p99, queue depth).",
        "lumenrt.dashboard.launch:add_arguments",
        "lumenrt.dashboard.launch:run_from_args",
        extra="dashboard",
    ),
)

# Former subcommands, now scripts in a checkout's benchmarks/ (benchmarks are not shipped in the
# package): typing one is answered with the script that replaces it.
MOVED: dict[tuple[str, ...], str] = {
    ("bench", "queues"): "benchmarks/queues.py",
    ("bench", "engine"): "benchmarks/engine.py",
    ("bench", "stages"): "benchmarks/stages.py",
    ("bench", "serve"): "benchmarks/serve.py",
}

_GROUP_HELP: dict[tuple[str, ...], str] = {("bench",): "benchmarks (see `lumenrt bench --help`)"}
_GROUP_DESCRIPTION: dict[tuple[str, ...], str] = {
    ("bench",): "The load generator, the architecture matrix and the static report. The other "
    "benchmarks are scripts in a lumenrt checkout: " + ", ".join(MOVED.values()) + "."
}


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


def _build_parser() -> tuple[argparse.ArgumentParser, dict[tuple[str, ...], argparse.ArgumentParser]]:
    """The whole command tree with every command's help text but none of its arguments (adding
    them imports the command's module: ``_selected`` picks the one command that gets them)."""
    parser = argparse.ArgumentParser(
        prog="lumenrt",
        description="lumenrt: a low-latency inference server with a small native core.",
    )
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {
        (): parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    }
    leaves: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for command in COMMANDS:
        *group, word = command.words
        for depth in range(1, len(group) + 1):
            path = tuple(group[:depth])
            if path not in groups:
                sub = groups[path[:-1]].add_parser(
                    path[-1], help=_GROUP_HELP.get(path), description=_GROUP_DESCRIPTION.get(path)
                )
                groups[path] = sub.add_subparsers(
                    dest=f"{'_'.join(path)}_command", metavar=path[-1].upper(), required=True
                )
        shown = f"{command.help} (needs the '{command.extra}' extra)" if command.extra else command.help
        leaves[command.words] = groups[tuple(group)].add_parser(
            word, help=shown, description=command.description
        )
    return parser, leaves


def _selected(argv: Sequence[str]) -> Command | None:
    """The command that ``argv`` names (its leading words), if any; argparse reports the rest."""
    return next((c for c in COMMANDS if tuple(argv[: len(c.words)]) == c.words), None)


def _expand_bench_shorthand(argv: list[str]) -> list[str]:
    """``lumenrt bench --target ...`` means ``lumenrt bench load --target ...``."""
    if len(argv) >= 2 and argv[0] == "bench" and argv[1].startswith("-") and argv[1] not in ("-h", "--help"):
        return ["bench", "load", *argv[1:]]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    words = _expand_bench_shorthand(list(sys.argv[1:] if argv is None else argv))
    moved = next((w for w in MOVED if tuple(words[: len(w)]) == w), None)
    if moved is not None:
        print(
            f"lumenrt {' '.join(moved)}: moved out of the package: run `python {MOVED[moved]}` "
            "(same arguments) in a lumenrt checkout",
            file=sys.stderr,
        )
        return 2
    parser, leaves = _build_parser()
    command = _selected(words)
    if command is not None:
        _resolve(command.arguments)(leaves[command.words])
    args = parser.parse_args(words)
    if command is None:  # argparse exits on an incomplete or unknown command: not reached
        parser.error("no command")
    name = "lumenrt " + " ".join(command.words)
    try:
        if command.extra is not None:
            require(command.extra, *command.needs)
        status: int = _resolve(command.run)(args)
    except MissingExtra as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an extra's module imported deeper down than `needs` says
        extra = extra_providing(exc.name or "")
        if extra is None:
            raise
        print(f"{name}: {MissingExtra(extra, (exc.name or extra,))}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
