"""What a gRPC round trip costs before any server work: the grpcio client against two echo servers.

    .venv/bin/python benchmarks/grpc_floor.py [--n 3000] [--repeats 3] [--out results/]

Issue 12 asks lumenrt's gRPC row to come within 1.3x of its HTTP row. benchmarks/latency.py shows
grpcio's own echo (a grpc.aio server answering a prebuilt reply) already at about 2x lumenrt's
whole HTTP round trip. This splits that floor into client and server: the same grpcio client
(``channel.unary_unary``, as latency.py's gRPC row and tritonclient use it) calls

* ``grpc.aio``: a grpc.aio server on uvloop answering a fixed reply;
* ``h2``: a pure-Python HTTP/2 server (the ``h2`` package, if installed: ``pip install h2``) on
  uvloop answering the same reply, which times its own work per request.

``h2``'s p50 minus its server time is what the client and the loopback cost, whatever the server;
the ``lumenrt HTTP`` row beside them is ``lumenrt serve``'s whole round trip (digits_mlp, V2 binary
tensors, keep-alive ``http.client``: latency.py's HTTP row). Rows alternate over ``--repeats`` rounds; figures are the medians of the rounds. Prints a table
and writes ``grpc-floor-<stamp>.json``.
"""

import argparse
import asyncio
import contextlib
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from latency import MODEL, _grpc_echo_main, http_measure, lumenrt_server  # beside this file
from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.models.builtin import builtin_examples

METHOD = "/inference.GRPCInferenceService/ModelInfer"
REPLY = b"r" * 100  # about the size of digits_mlp's answer
REQUEST = b"q" * 300


def _h2_server(pipe: Any, reply: bytes) -> None:
    """The h2 echo: answers ``reply``; each message on ``pipe`` is answered with the server's
    mean time per call since the last one (µs), and resets it."""
    import h2.config
    import h2.connection
    import h2.events
    import uvloop

    config = h2.config.H2Configuration(client_side=False, header_encoding=None)
    work = {"ns": 0, "requests": 0}
    framed = b"\x00" + len(reply).to_bytes(4, "big") + reply  # gRPC's length-prefixed message

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.conn = transport, h2.connection.H2Connection(config=config)
            self.conn.initiate_connection()
            transport.write(self.conn.data_to_send())

        def data_received(self, data: bytes) -> None:
            start, conn = time.perf_counter_ns(), self.conn
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    sid = event.stream_id
                    conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
                    conn.send_data(sid, framed)
                    conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
                    work["requests"] += 1
            out = conn.data_to_send()
            if out:
                self.transport.write(out)
            work["ns"] += time.perf_counter_ns() - start

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        pipe.send(server.sockets[0].getsockname()[1])
        while True:
            await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # reset, or stop
            pipe.send(work["ns"] / max(work["requests"], 1) / 1000)
            work.update(ns=0, requests=0)

    uvloop.run(main())


def _percentiles(latencies_ns: list[int]) -> tuple[float, float]:
    latencies_ns.sort()
    return latencies_ns[len(latencies_ns) // 2] / 1000, latencies_ns[int(len(latencies_ns) * 0.99)] / 1000


def _grpc_round(port: int, n: int) -> tuple[float, float]:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(METHOD, request_serializer=bytes, response_deserializer=bytes)
    try:
        for _ in range(200):  # warm-up
            call(REQUEST, timeout=30)
        latencies = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            call(REQUEST, timeout=30)
            latencies.append(time.perf_counter_ns() - t0)
    finally:
        channel.close()
    return _percentiles(latencies)


def _http_round(port: int, n: int) -> tuple[float, float]:
    measure, close = http_measure(port, builtin_examples(MODEL, 1))
    try:
        measure(200)  # warm-up
        return _percentiles(measure(n))
    finally:
        close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="calls per row per round (default 3000)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; figures are their medians")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    # name -> the echo server's main (latency.py's grpc.aio echo: the same floor it measures)
    servers: dict[str, Any] = {"grpc.aio": _grpc_echo_main}
    try:
        import h2  # noqa: F401
    except ImportError:
        print("grpc_floor: the h2 row needs `pip install h2`; measuring grpc.aio only", file=sys.stderr)
    else:
        servers["h2"] = _h2_server
    ctx = multiprocessing.get_context("spawn")
    names = ["lumenrt HTTP", *servers]
    rounds: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name in names}
    children = {}
    with contextlib.ExitStack() as stack:
        http_port = stack.enter_context(lumenrt_server(None)).ports["http"]
        stack.callback(lambda: [(p.kill(), p.join(10)) for p, _, _ in children.values()])
        for name, target in servers.items():
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=target, args=(theirs, REPLY), daemon=True)
            process.start()
            children[name] = (process, ours, ours.recv())
        for r in range(args.repeats):
            for name in names if r % 2 == 0 else reversed(names):
                if name == "lumenrt HTTP":
                    rounds[name].append((*_http_round(http_port, args.n), None))
                    continue
                process, pipe, port = children[name]
                timed = name == "h2"  # the grpc.aio echo times nothing (and stops on a message)
                if timed:
                    pipe.send("reset")
                    pipe.recv()
                p50, p99 = _grpc_round(port, args.n)
                if timed:
                    pipe.send("read")
                rounds[name].append((p50, p99, pipe.recv() if timed else None))
    rows = {}
    for name, values in rounds.items():
        p50 = statistics.median(v[0] for v in values)
        timed = [v[2] for v in values if v[2] is not None]
        server_us = statistics.median(timed) if timed else None
        rows[name] = {
            "p50_us": round(p50, 1),
            "p99_us": round(statistics.median(v[1] for v in values), 1),
            "server_us_per_call": None if server_us is None else round(server_us, 1),
            "client_and_wire_us": None if server_us is None else round(p50 - server_us, 1),
            "rounds": values,
        }
        extra = (
            ""
            if server_us is None
            else f"  server {server_us:.1f} us/call, client + wire {p50 - server_us:.1f} us"
        )
        print(f"{name:12} p50 {p50:8.1f} us  p99 {rows[name]['p99_us']:8.1f} us{extra}")
    payload = {"benchmark": "grpc_floor", "machine": machine_info(), "commit": git_commit()}
    path = write_result(
        args.out, "grpc-floor", {**payload, "n": args.n, "repeats": args.repeats, "rows": rows}
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
