"""The ``lumenrt`` command."""

import argparse
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lumenrt",
        description="lumenrt: a low-latency inference server with a small native core.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from lumenrt.server.serve import add_arguments as add_serve_args

    add_serve_args(
        sub.add_parser(
            "serve",
            help="serve a model repository over KServe V2 HTTP and gRPC and the binary TCP protocol",
            description="Serve a model repository (default: the built-in models) over KServe V2 "
            "HTTP/REST (tritonclient.http, perf_analyzer), KServe V2 gRPC (tritonclient.grpc) and "
            "lumenrt's binary TCP protocol (lumenrt.client). Prints where it listens, then 'ready'.",
        )
    )

    demo = sub.add_parser(
        "demo",
        help="run a short demo of the native core (ring + arena across processes)",
        description="Start worker processes that answer requests passed through a shared-memory "
        "MPMC ring and slab arena, and print the round-trip latency. Sends only in-process/IPC "
        "traffic; stops by itself.",
    )
    demo.add_argument("--requests", type=int, default=20000, help="requests to send (default 20000)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    demo.add_argument("--queue-type", default="mpmc", choices=["mpmc", "naive", "batched"])

    bench = sub.add_parser("bench", help="benchmarks (see `lumenrt bench --help`)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    from lumenrt.bench.queues import add_arguments as add_queue_args

    add_queue_args(
        bench_sub.add_parser(
            "queues",
            help="native rings vs queue.Queue, multiprocessing.Queue, faster-fifo, pyzmq",
            description="Measure, in one run: push+pop pair cost, one-way handoff latency between "
            "threads and between processes (consumer waiting and busy), and 2-producer/2-consumer "
            "throughput. Prints a table (or JSON rows with --json) and writes a result file "
            "recording machine, commit and configuration.",
        )
    )
    from lumenrt.bench.engine_bench import add_arguments as add_engine_args

    add_engine_args(
        bench_sub.add_parser(
            "engine",
            help="the engine against raw ONNX Runtime sessions: throughput, overhead, architecture table",
            description="Measure, in one run with the built-in models: SqueezeNet throughput through "
            "the engine (2 workers) against 2 raw ONNX Runtime threads, the engine's batch-1 overhead "
            "on digits_mlp (thread and process mode), and the queue_type x allocator_type table. "
            "Prints a table (or JSON rows with --json) and writes a result file recording machine, "
            "commit and configuration.",
        )
    )
    from lumenrt.bench.stages import add_arguments as add_stage_args

    add_stage_args(
        bench_sub.add_parser(
            "stages",
            help="where a batch-1 request spends its time: per-stage medians, thread and process mode",
            description="Send digits_mlp requests one at a time from one synchronous client and print "
            "the median and p99 of each stage (ingress, hand-off to the worker, compute, return to "
            "the caller) from the engine's own timestamps. Writes a result file.",
        )
    )
    from lumenrt.bench.serve_bench import add_arguments as add_serve_bench_args

    add_serve_bench_args(
        bench_sub.add_parser(
            "serve",
            help="lumenrt serve vs Triton (perf_analyzer, SqueezeNet) and round trips vs a TCP echo",
            description="In one run: SqueezeNet through 2 raw ONNX Runtime threads (the ceiling); "
            "perf_analyzer against `lumenrt serve` and against Triton (PyTriton, .venv-triton) at "
            "concurrency 1, 2, 4, 8 over HTTP and gRPC; digits_mlp batch-1 round trips over TCP "
            "(against a loopback echo of the same bytes), HTTP binary and gRPC. Servers run one at "
            "a time. Prints tables and the acceptance ratios; writes a result file.",
        )
    )
    from lumenrt.bench.load_cli import add_arguments as add_load_args

    add_load_args(
        bench_sub.add_parser(
            "load",
            help="the load generator: closed or open loop against a running server (TCP, HTTP, gRPC)",
            description="Drive one model of a running server from this process (or --processes "
            "more): closed loop (--concurrency clients) or open loop (--rate, constant or Poisson "
            "arrivals, latency measured from the intended send time). Prints HdrHistogram "
            "percentiles, throughput and errors by kind; writes a per-request CSV and a summary "
            "JSON (machine, commit, server config, load config). `lumenrt bench --target ...` is "
            "short for `lumenrt bench load --target ...`.",
        )
    )
    from lumenrt.bench.matrix import add_arguments as add_matrix_args

    add_matrix_args(
        bench_sub.add_parser(
            "matrix",
            help="the architecture table: queue x allocator x worker mode x batch size, each served and loaded",
            description="For each configuration, start `lumenrt serve` with it, drive SqueezeNet at a "
            "fixed offered rate (open loop) and at saturation (closed loop), and stop it; in the same "
            "run measure the raw limit (ONNX Runtime in-process, same cores) so every row has a ratio "
            "to it. Prints the table (throughput, p50, p99, p99.9, mean compute) and writes it.",
        )
    )
    from lumenrt.dashboard.report_cli import add_arguments as add_report_args

    add_report_args(
        bench_sub.add_parser(
            "report",
            help="write the dashboard's plots for result files as one static HTML file (no server)",
            description="Read result files (load, matrix, peers) from a results folder and write one "
            "self-contained HTML file with the dashboard's plots (plotly.js inline, works offline).",
        )
    )
    from lumenrt.dashboard.launch import add_arguments as add_dashboard_args

    add_dashboard_args(
        sub.add_parser(
            "dashboard",
            help="open the Streamlit dashboard over a results folder",
            description="Start a Streamlit app on 127.0.0.1 over the result files in RESULTS_DIR "
            "(default results/): latency over time, throughput over time, percentiles and CDF, time "
            "per stage, and runs side by side (architecture matrix, peer table).",
        )
    )
    return parser


def _expand_bench_shorthand(argv: list[str]) -> list[str]:
    """``lumenrt bench --target ...`` means ``lumenrt bench load --target ...``."""
    if len(argv) >= 2 and argv[0] == "bench" and argv[1].startswith("-") and argv[1] not in ("-h", "--help"):
        return ["bench", "load", *argv[1:]]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(_expand_bench_shorthand(list(sys.argv[1:] if argv is None else argv)))
    if args.command == "serve":
        from lumenrt.server.serve import run_from_args as run_serve

        return run_serve(args)
    if args.command == "demo":
        from lumenrt.demo import run_demo

        return run_demo(requests=args.requests, workers=args.workers, queue_type=args.queue_type)
    if args.command == "bench" and args.bench_command == "queues":
        from lumenrt.bench.queues import run_from_args

        return run_from_args(args)
    if args.command == "bench" and args.bench_command == "engine":
        from lumenrt.bench.engine_bench import run_from_args as run_engine_bench

        return run_engine_bench(args)
    if args.command == "bench" and args.bench_command == "serve":
        from lumenrt.bench.serve_bench import run_from_args as run_serve_bench

        return run_serve_bench(args)
    if args.command == "bench" and args.bench_command == "stages":
        from lumenrt.bench.stages import run_from_args as run_stages

        return run_stages(args)
    if args.command == "bench" and args.bench_command == "load":
        from lumenrt.bench.load_cli import run_from_args as run_load

        return run_load(args)
    if args.command == "bench" and args.bench_command == "matrix":
        from lumenrt.bench.matrix import run_from_args as run_matrix

        return run_matrix(args)
    if args.command == "bench" and args.bench_command == "report":
        from lumenrt.dashboard.report_cli import run_from_args as run_report

        return run_report(args)
    if args.command == "dashboard":
        from lumenrt.dashboard.launch import run_from_args as run_dashboard

        return run_dashboard(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
