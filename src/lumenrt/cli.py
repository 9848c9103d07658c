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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
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
    return 2


if __name__ == "__main__":
    sys.exit(main())
