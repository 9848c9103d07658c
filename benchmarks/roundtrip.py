"""Round-trip latency at concurrency 1 over the binary TCP protocol, against a loopback echo floor.

A module of the benchmarks in this folder (``serve.py``, ``latency.py``), which import it by plain
name (a script's folder comes first on sys.path):

    with start_serve("--models", "digits_mlp") as server:   # lumenrt.bench.serve_process
        report = serve_vs_echo("127.0.0.1", server.ports["tcp"], "digits_mlp", inputs, n=20_000)
        report["ratio_p50"]                                     # TCP p50 / echo p50

The floor (``echo_floor``) is what any request/response over loopback TCP costs here: a uvloop
``asyncio.Protocol`` server in another process (so client and server do not share a GIL) that,
for every ``request_bytes`` it receives, writes ``response_bytes`` back; the client is a blocking
socket that sends exactly as many bytes as the inference request frame and reads exactly as
many as its response frame, with the same calls ``TcpClient`` makes (one ``sendall``, ``recv``
until complete, TCP_NODELAY). ``tcp_round_trip`` times ``TcpClient.infer``. ``serve_vs_echo``
alternates blocks of both in one run, so the two see the same machine, and reports the ratio.

Latencies are nanoseconds of ``time.perf_counter_ns`` around one request, after a warm-up.
"""

import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np

from lumenrt.client.tcp import RECV_BYTES, TcpClient
from lumenrt.protocols.tcp import HEADER_BYTES, encode_request, encode_response

START_TIMEOUT_S = 60.0  # the echo server process reports its port within this


def bench_load(*args: str, python: str | None = None) -> dict[str, Any]:
    """One ``lumenrt bench load ARGS --quiet --json`` run in its own process, from ``python``'s
    install (default: this one): its summary. RuntimeError with its output if it fails."""
    cmd = [python or sys.executable, "-m", "lumenrt.cli", "bench", "load", *args, "--quiet", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout[done.stdout.find("{") :])
    return summary


def bench_load_cpu(
    *args: str,
    server_pid: int,
    seconds: float,
    warmup_s: float,
    loop_thread: bool = True,
    python: str | None = None,
) -> dict[str, float]:
    """``load_figures`` of one ``bench_load`` run (``args`` give ``seconds`` measured after
    ``warmup_s``), and where the CPU went per request: the server's event-loop thread (its main
    thread; nan without ``loop_thread``), the whole server (its processes) and the load generator
    (its measured window; nan from an install that does not report it)."""
    loop0, server0 = cpu_s(server_pid, server_pid), tree_cpu_s(server_pid)
    summary = bench_load(*args, python=python)
    got = load_figures(summary)
    requests = max(got["throughput_per_s"] * (seconds + warmup_s), 1.0)  # the warm-up at about the same rate
    loop_s = cpu_s(server_pid, server_pid) - loop0 if loop_thread else float("nan")
    got["loop_cpu_us"] = loop_s / requests * 1e6
    got["server_cpu_us"] = (tree_cpu_s(server_pid) - server0) / requests * 1e6
    got["client_cpu_us"] = float((summary.get("load_cpu") or {}).get("us_per_request") or "nan")
    return got


def load_figures(summary: dict[str, Any]) -> dict[str, float]:
    """Throughput, p50 and p99 (µs) and errors of a ``bench_load`` summary."""
    lat = summary["latency_us"]
    return {
        "throughput_per_s": float(summary["throughput_per_s"]),
        "p50_us": float(lat["p50"]),
        "p99_us": float(lat["p99"]),
        "errors": int(summary["counts"]["errors"]),
    }


def cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds so far of process ``pid`` (its threads included), or of its
    thread ``tid`` alone."""
    where = f"/proc/{pid}" if tid is None else f"/proc/{pid}/task/{tid}"
    fields = Path(f"{where}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """``cpu_s`` of process ``pid`` and of every process below it that is still running (e.g. a
    server's worker processes); 0 for one gone meanwhile."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_s(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def markdown_table(title: str, rows: dict[str, dict[str, Any]], cols: tuple[str, ...]) -> str:
    """``rows`` (name -> figures) as a titled Markdown table of the ``cols`` figures."""
    lines = [f"\n{title}", "| row | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def stats(latencies_ns: Sequence[int]) -> dict[str, float]:
    """p50/p90/p99/mean in microseconds, and the count."""
    a = np.asarray(latencies_ns, dtype=np.float64) / 1000.0
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "n": float(len(a)),
        "p50_us": round(float(p50), 2),
        "p90_us": round(float(p90), 2),
        "p99_us": round(float(p99), 2),
        "mean_us": round(float(a.mean()), 2),
    }


def frame_sizes(
    model: str, inputs: Mapping[str, Any], outputs: Sequence[tuple[str, Any]], version: int = 1
) -> tuple[int, int]:
    """Bytes on the wire of a request frame with ``inputs`` and of a response frame carrying
    ``outputs`` (name, array), no timing."""
    request = sum(len(p) for p in encode_request(1, model, inputs))
    response = sum(len(p) for p in encode_response(1, model, version, list(outputs)))
    return request, response


# ---- the echo floor ------------------------------------------------------------------------------


class _Echo(asyncio.Protocol):
    """Answers every ``request_bytes`` received with ``response`` (one write)."""

    def __init__(self, request_bytes: int, response: bytes) -> None:
        self.request_bytes = request_bytes
        self.response = response
        self.have = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.have += len(data)
        while self.have >= self.request_bytes:
            self.have -= self.request_bytes
            assert self.transport is not None
            self.transport.write(self.response)


class _HttpEcho(_Echo):
    """Answers every HTTP/1.1 request with ``response`` (prebuilt: status line, headers, body) once
    its headers and ``Content-Length`` bytes of body are in; nothing else is parsed."""

    def __init__(self, response: bytes) -> None:
        super().__init__(0, response)
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in bytes(buffer[:end]).split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buffer) < end + 4 + length:
                return
            del buffer[: end + 4 + length]
            assert self.transport is not None
            self.transport.write(self.response)


def _echo_server_main(pipe: Connection, request_bytes: int, response: int | bytes) -> None:
    """An echo server on uvloop: with ``request_bytes`` > 0, ``response`` (bytes, or that many zero
    bytes) for every ``request_bytes`` received; with 0, an HTTP echo (``_HttpEcho``)."""
    import uvloop

    loop = uvloop.new_event_loop()
    answer = bytes(response) if isinstance(response, int) else response
    server = loop.run_until_complete(
        loop.create_server(
            (lambda: _Echo(request_bytes, answer)) if request_bytes else (lambda: _HttpEcho(answer)),
            "127.0.0.1",
            0,
        )
    )
    pipe.send(cast(Any, server).sockets[0].getsockname()[1])
    _stop_on_input(loop, pipe)
    try:
        loop.run_forever()
    finally:
        server.close()
        loop.close()


def _stop_on_input(loop: asyncio.AbstractEventLoop, pipe: Connection) -> None:
    """Stop ``loop`` once, when the parent writes to or closes ``pipe``."""

    def stop() -> None:
        loop.remove_reader(pipe.fileno())
        loop.stop()

    loop.add_reader(pipe.fileno(), stop)


class _Child:
    """A spawned process that reports a port through a pipe, stopped by writing to the pipe."""

    def __init__(self, target: Any, args: tuple[Any, ...], name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._pipe, child_end = ctx.Pipe()
        self._process = ctx.Process(target=target, args=(child_end, *args), name=name, daemon=True)
        self._process.start()
        child_end.close()
        self.port = 0
        try:
            if not self._pipe.poll(START_TIMEOUT_S):
                raise TimeoutError(f"{name} did not report its port within {START_TIMEOUT_S:g} s")
            self.port = int(self._pipe.recv())
        except EOFError:
            self.stop()
            raise RuntimeError(
                f"{name} exited before reporting its port (exit code {self._process.exitcode})"
            ) from None
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._pipe.send(None)
        self._pipe.close()
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


def _measure_echo(port: int, request: bytes, response_bytes: int, n: int, warmup: int) -> list[int]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    clock = time.perf_counter_ns
    out: list[int] = []
    try:
        for i in range(warmup + n):
            t0 = clock()
            sock.sendall(request)
            got = 0
            while got < response_bytes:
                chunk = sock.recv(RECV_BYTES)
                if not chunk:
                    raise ConnectionError("echo server closed the connection")
                got += len(chunk)
            t1 = clock()
            if i >= warmup:
                out.append(t1 - t0)
    finally:
        sock.close()
    return out


def echo_floor(
    payload_bytes: int, n: int, *, response_bytes: int | None = None, warmup: int = 200
) -> list[int]:
    """Per-request latencies (ns) of ``n`` loopback round trips sending ``payload_bytes`` and
    reading ``response_bytes`` (default: as many as sent), against an echo server process."""
    if payload_bytes < 1:
        raise ValueError(f"payload_bytes must be >= 1, got {payload_bytes}")
    back = payload_bytes if response_bytes is None else response_bytes
    child = _Child(_echo_server_main, (payload_bytes, back), "lumenrt-echo")
    try:
        return _measure_echo(child.port, bytes(payload_bytes), back, n, warmup)
    finally:
        child.stop()


# ---- the inference server ------------------------------------------------------------------------


def _measure_tcp(
    client: TcpClient, model: str, inputs: Mapping[str, Any], n: int, warmup: int, timing: bool
) -> list[int]:
    clock = time.perf_counter_ns
    infer = client.infer
    for _ in range(warmup):
        infer(model, inputs, timing=timing)
    out: list[int] = []
    for _ in range(n):
        t0 = clock()
        infer(model, inputs, timing=timing)
        out.append(clock() - t0)
    return out


def tcp_round_trip(
    host: str,
    port: int,
    model: str,
    inputs: Mapping[str, Any],
    n: int,
    *,
    warmup: int = 200,
    timing: bool = False,
) -> list[int]:
    """Per-request latencies (ns) of ``n`` back-to-back ``TcpClient.infer`` calls."""
    with TcpClient(host, port) as client:
        return _measure_tcp(client, model, inputs, n, warmup, timing)


def serve_vs_echo(
    host: str,
    port: int,
    model: str,
    inputs: Mapping[str, Any],
    n: int,
    *,
    blocks: int = 5,
    warmup: int = 500,
) -> dict[str, Any]:
    """TCP round trip and echo floor for the same byte counts, in alternating blocks of one run:
    ``{"tcp": stats, "echo": stats, "ratio_p50": tcp p50 / echo p50, "request_bytes": ...}``."""
    per_block = max(1, n // blocks)
    with TcpClient(host, port) as client:
        first = client.infer(model, inputs)
        request_bytes, response_bytes = frame_sizes(model, inputs, list(first.outputs.items()))
        assert request_bytes > HEADER_BYTES
        child = _Child(_echo_server_main, (request_bytes, response_bytes), "lumenrt-echo")
        try:
            request = bytes(request_bytes)
            tcp: list[int] = []
            echo: list[int] = []
            _measure_echo(child.port, request, response_bytes, 0, warmup)
            _measure_tcp(client, model, inputs, 0, warmup, False)
            for _ in range(blocks):
                echo += _measure_echo(child.port, request, response_bytes, per_block, 50)
                tcp += _measure_tcp(client, model, inputs, per_block, 50, False)
        finally:
            child.stop()
    t, e = stats(tcp), stats(echo)
    return {
        "model": model,
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
        "tcp": t,
        "echo": e,
        "ratio_p50": round(t["p50_us"] / e["p50_us"], 3),
    }
