"""lumenrt's own gRPC server against grpc.aio's, through the server, in interleaved rounds.

    .venv/bin/python benchmarks/grpc_servers.py [--targets grpc grpcio] [--concurrency 1 8]
        [--rounds 3] [--load-s 3] [--model digits_mlp] [--out results/]

Each round starts a fresh ``lumenrt serve`` with ``grpc_server: h2`` (ingress/grpc_h2.py, the
default) and one with ``grpc_server: grpcio`` (ingress/grpc_server.py), and drives each with
``lumenrt bench load`` over gRPC through two clients: ``grpc`` (lumenrt's own,
``lumenrt.client.grpc.AsyncGrpcClient``) and ``grpcio`` (grpc.aio's, as tritonclient calls).
Figures (serve_ab.py): throughput, p50, p99, and CPU µs per request of the server and of the load
generator, medians over the rounds, each row against the h2 server. Prints a table, writes
``grpc-servers-<stamp>.json``.
"""

import argparse
import sys
from pathlib import Path

from serve_ab import ROOT, Variant, compare  # beside this file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", nargs="+", choices=("grpc", "grpcio"), default=["grpc", "grpcio"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--load-s", type=float, default=3.0, help="measured seconds per load run")
    p.add_argument("--model", default="digits_mlp", help="a built-in model")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.load_s <= 0 or min(args.concurrency) < 1:
        p.error("--rounds, --load-s and every --concurrency must be > 0")
    variants = [Variant(f"server {kind}", server={"grpc_server": kind}) for kind in ("h2", "grpcio")]
    return compare(variants, args, model=args.model, kind="grpc-servers", title=f"{args.model} over gRPC")


if __name__ == "__main__":
    sys.exit(main())
