"""The small-model request path, measured: c1 round trips, stages, allocations, throughput.

    .venv/bin/python benchmarks/latency.py [--baseline-python /path/to/other/venv/bin/python]
        [--repeats 3] [--n 5000] [--out results/]

digits_mlp, batch 1, in one run on this machine:

1. **c1 round trips** against a loopback echo of the same bytes: lumenrt binary TCP
   (``TcpClient``), lumenrt HTTP (V2 binary tensor extension, keep-alive ``http.client``), lumenrt
   gRPC (lumenrt's own ``GrpcClient``, one HTTP/2 connection; and beside it through grpcio's client,
   one channel, as tritonclient calls it), an **HTTP echo floor** (a uvloop server that answers
   every request with lumenrt's prebuilt answer bytes once its headers and body are in, through the
   same keep-alive ``http.client``: what that client and the loopback alone cost), FastAPI with the
   same ONNX session
   inline (``benchmarks/peers/fastapi_app.py`` under uvicorn, one worker, raw bytes, keep-alive
   ``http.client``) and, with ``--baseline-python``, the same three lumenrt rows from another
   install (e.g. the commit before a change), and a **grpcio echo floor**: a grpc.aio server on
   uvloop that answers ModelInfer with lumenrt's serialized answer without decoding the request,
   through grpcio's client (what grpcio alone costs a round trip). Rows are measured in interleaved blocks, ``--repeats``
   rounds; each figure is the median of the rounds' p50 (p99). With ``--loop-spin-us N``, a second
   lumenrt server given ``--loop-spin-us N`` (its event loop polls for N µs after each request
   instead of sleeping: ingress/loop_spin.py) adds rows ``lumenrt spin`` here and in 4.
2. **Stages** of one TCP request from the server's own timestamps (the timing flag): engine time
   (received -> completed), queue, batch, compute, return; the rest of the round trip is the
   client, the wire, parsing, encoding and writing.
3. **Allocations per request** on the TCP and HTTP paths: the server runs with
   ``PYTHONMALLOC=malloc`` and ``alloc_counter.c`` preloaded (every malloc-family call counted in a
   shared file), and the count over ``--alloc-n`` requests is divided by them. Counts the whole
   server process (event loop and workers); the client is not counted. The same count for a bare
   ONNX Runtime ``session.run`` of the model is shown beside it: what is left is the server's.
4. **Throughput** with ``lumenrt bench load`` (closed loop, ``--load-s`` seconds, the medians of
   ``--load-repeats`` runs per row, as for SqueezeNet below): TCP at
   concurrency 8 (against the baseline when given, each through its own install's load generator,
   so that a baseline speaking another TCP protocol version can be measured; its TCP round trips,
   stages and allocations are then left out), and HTTP and gRPC at concurrency 1, 4, 8 against
   FastAPI with 2 uvicorn workers.
5. **SqueezeNet** batch 1 through TCP, HTTP and gRPC at concurrency 1, 2, 4, 8 against the raw loop
   of the same run (2 threads, an ONNX Runtime session each, no server; the median of three runs
   of it spread over the section). The server gets the same
   compute: a worker per usable CPU (``--placement roundrobin``), since on a machine of few CPUs the
   placement plan keeps one CPU for the event loop and gives a lone SqueezeNet the rest (on 2 CPUs,
   one worker: README, Placement), which would measure the plan, not the request path. Beside
   each row, where the CPU went per request: the server's event-loop thread, the whole server
   (workers included), and the load generator (``lumenrt bench load``'s own ``load_cpu``), which
   shares the machine's CPUs with the server and the raw loop does not have; and the throughput
   the machine's CPUs allow at that cost (``cpu_bound_per_s``: CPUs / (server + load generator CPU
   per request)). Where the measured throughput meets it, the row is CPU-bound.

FastAPI runs from ``--fastapi-python`` (default ``.venv-fastapi``, created with the peer
benchmark's pins when missing; ``--no-fastapi`` leaves those rows out). Prints the tables and writes ``latency-<stamp>.json``.
"""

import argparse
import contextlib
import http.client
import json
import math
import mmap
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from lumenrt.client.http import encode_infer
from lumenrt.client.tcp import TcpClient
from lumenrt.models.builtin import builtin_examples, ensure_builtin_repository
from lumenrt.placement.cpu_idle import halts_at_once, read_cpu_idle
from roundtrip import (
    _Child,
    _echo_server_main,
    _measure_echo,
    bench_load,
    bench_load_cpu,
    frame_sizes,
    load_figures,
    markdown_table,
    stats,
)  # beside this file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "digits_mlp"
LUMENRT_ROWS = ("lumenrt", "lumenrt spin")  # this install's servers: the default, and --loop-spin-us N
WARMUP = 300
Measure = Callable[[int], list[int]]  # n requests -> per-request latencies (ns)
DEFAULT_FASTAPI = ROOT / ".venv-fastapi" / "bin" / "python"


def fastapi_venv() -> None:
    """``.venv-fastapi`` with the peer benchmark's pins (benchmarks/peers/venvs.py)."""
    sys.path.insert(0, str(HERE / "peers"))
    try:
        from venvs import ensure_venv, venv_specs  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    ensure_venv(venv_specs()["fastapi"])


# ---- clients: each returns a function that times n back-to-back requests ------------------------


def _timed(call: Callable[[], object], n: int) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        call()
        out.append(clock() - t0)
    return out


def speaks_our_tcp(port: int, inputs: dict[str, Any]) -> bool:
    """Whether the server at ``port`` answers this install's TcpClient (the same protocol version)."""
    try:
        with TcpClient("127.0.0.1", port) as client:
            client.infer(MODEL, inputs)
    except ConnectionError:
        return False
    return True


def tcp_measure(port: int, inputs: dict[str, Any]) -> tuple[Measure, Callable[[], None]]:
    client = TcpClient("127.0.0.1", port)
    return (lambda n: _timed(lambda: client.infer(MODEL, inputs), n)), client.close


def _http_post(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> tuple[Measure, Callable[[], None]]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def one() -> None:
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: {resp.status} {data[:200]!r}")

    return (lambda n: _timed(one, n)), conn.close


def http_measure(port: int, inputs: dict[str, Any]) -> tuple[Measure, Callable[[], None]]:
    req = encode_infer(MODEL, inputs)
    return _http_post(port, req.path, req.body, dict(req.headers))


def http_answer(port: int, inputs: dict[str, Any]) -> bytes:
    """The bytes of the V2 binary answer lumenrt's HTTP front end gives ``inputs`` (status line,
    headers and body): what the HTTP echo floor sends back, so the client parses the same."""
    req = encode_infer(MODEL, inputs)
    head = "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            f"POST {req.path} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(req.body)}\r\n\r\n".encode()
            + req.body
        )
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(65536)
        end = got.index(b"\r\n\r\n") + 4
        length = int(got[:end].lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(got) < end + length:
            got += sock.recv(65536)
    if not got.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"the HTTP answer to copy: {got[:200]!r}")
    return got[: end + length]


def echo_floors(
    stack: contextlib.ExitStack, server: ServeProcess, inputs: dict[str, Any]
) -> dict[str, Measure]:
    """The floors beside ``server``: an echo of its TCP frames' sizes over a raw socket, and an HTTP
    echo of its HTTP answer through ``http.client``. Their servers and client end with ``stack``."""
    with TcpClient("127.0.0.1", server.ports["tcp"]) as client:
        first = client.infer(MODEL, inputs)
    req_bytes, resp_bytes = frame_sizes(MODEL, inputs, list(first.outputs.items()))
    echo = _Child(_echo_server_main, (req_bytes, resp_bytes), "lumenrt-echo")
    stack.callback(echo.stop)
    http_echo = _Child(_echo_server_main, (0, http_answer(server.ports["http"], inputs)), "lumenrt-http-echo")
    stack.callback(http_echo.stop)
    http_floor, close = http_measure(http_echo.port, inputs)
    stack.callback(close)
    request = bytes(req_bytes)
    return {
        "echo floor": lambda n: _measure_echo(echo.port, request, resp_bytes, n, 0),
        "HTTP echo floor": http_floor,
    }


def fastapi_measure(port: int, inputs: dict[str, Any]) -> tuple[Measure, Callable[[], None]]:
    (array,) = inputs.values()
    body = np.ascontiguousarray(array).tobytes()
    return _http_post(port, f"/predict/{MODEL}", body, {"Content-Type": "application/octet-stream"})


def grpc_measure(port: int, inputs: dict[str, Any]) -> tuple[Measure, Callable[[], None]]:
    """lumenrt's own gRPC client (``lumenrt.client.grpc.GrpcClient``: one HTTP/2 connection)."""
    from lumenrt.client.grpc import GrpcClient, encode_infer

    client = GrpcClient("127.0.0.1", port)
    request = encode_infer(MODEL, inputs)
    return (lambda n: _timed(lambda: client.call("ModelInfer", request, 30.0), n)), client.close


def grpcio_measure(port: int, inputs: dict[str, Any]) -> tuple[Measure, Callable[[], None]]:
    """grpcio's client (one channel, the ModelInfer method as tritonclient calls it)."""
    import grpc
    import lumenrt.protocols.proto.grpc_service_pb2 as pb

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    request = pb.ModelInferRequest(model_name=MODEL)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return (lambda n: _timed(lambda: call(request, timeout=30), n)), channel.close


def _grpc_echo_main(pipe: Any, response: bytes) -> None:
    """A grpc.aio server on uvloop, as lumenrt's, whose ModelInfer answers a prebuilt response
    without decoding the request: what grpcio itself costs a round trip."""
    import asyncio

    import grpc
    import uvloop

    async def model_infer(request: bytes, context: Any) -> bytes:
        return response

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(
            model_infer, request_deserializer=bytes, response_serializer=bytes
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        pipe.send(port)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(pipe.fileno(), stop.set)
        await stop.wait()
        await server.stop(0)

    uvloop.run(main())


def grpc_echo_response(port: int, inputs: dict[str, Any]) -> bytes:
    """The serialized answer lumenrt's gRPC front end gives ``inputs`` (the echo floor sends it)."""
    import grpc
    import lumenrt.protocols.proto.grpc_service_pb2 as pb

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=bytes,
    )
    request = pb.ModelInferRequest(model_name=MODEL)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    try:
        return bytes(call(request, timeout=30))
    finally:
        channel.close()


# ---- servers ------------------------------------------------------------------------------------


@contextlib.contextmanager
def lumenrt_server(
    python: str | None, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()
) -> Iterator[ServeProcess]:
    command = [python, "-m", "lumenrt.cli"] if python else None
    with start_serve("--models", MODEL, *extra, command=command, env=env, cwd=str(ROOT)) as server:
        yield server


@contextlib.contextmanager
def fastapi_server(python: Path, model_path: Path, workers: int) -> Iterator[tuple[int, int]]:
    """uvicorn serving ``benchmarks/peers/fastapi_app.py``: (port, the uvicorn process's pid)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "PEERS_FASTAPI_MODELS": f"{MODEL}={model_path}"}
    cmd = [str(python), "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(HERE / "peers"),
           "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--no-access-log",
           "--log-level", "warning", "--timeout-keep-alive", "600"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"FastAPI exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
                )
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/ready")
                ready = conn.getresponse().status == 200
                conn.close()
                if ready:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("FastAPI did not become ready within 120 s")
            time.sleep(0.2)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- 1. c1 round trips --------------------------------------------------------------------------


def round_trips(rows: dict[str, Measure], n: int, repeats: int) -> dict[str, dict[str, float]]:
    """Interleaved blocks of every row, ``repeats`` rounds; per row the median over rounds of
    p50/p90/p99 and every round's figures."""
    for measure in rows.values():
        measure(WARMUP)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    for _ in range(repeats):
        for name, measure in rows.items():
            rounds[name].append(stats(measure(n)))
    out: dict[str, dict[str, float]] = {}
    for name, got in rounds.items():
        out[name] = {
            key: float(np.median([g[key] for g in got])) for key in ("p50_us", "p90_us", "p99_us", "mean_us")
        }
        out[name]["rounds_p50_us"] = [g["p50_us"] for g in got]  # type: ignore[assignment]
    return out


# ---- 2. stages ------------------------------------------------------------------------------------


def tcp_stages(port: int, inputs: dict[str, Any], n: int) -> dict[str, float]:
    """Medians (us) of the round trip and the server's stage times over n timed requests."""
    fields = ("engine_ns", "queue_ns", "batch_ns", "compute_ns", "return_ns")
    got: dict[str, list[int]] = {f: [] for f in ("round_trip_ns", *fields)}
    clock = time.perf_counter_ns
    with TcpClient("127.0.0.1", port) as client:
        for i in range(WARMUP + n):
            t0 = clock()
            result = client.infer(MODEL, inputs, timing=True)
            t1 = clock()
            if i < WARMUP:
                continue
            got["round_trip_ns"].append(t1 - t0)
            timing = result.timing or {}
            for f in fields:
                got[f].append(int(timing.get(f, 0)))
    med = {k.replace("_ns", "_us"): round(float(np.median(v)) / 1000, 2) for k, v in got.items()}
    med["outside_engine_us"] = round(med["round_trip_us"] - med["engine_us"], 2)
    return med


# ---- 3. allocations ---------------------------------------------------------------------------


def build_counter(tmp: Path) -> Path:
    lib = tmp / "alloc_counter.so"
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(HERE / "alloc_counter.c"), "-ldl"], check=True
    )
    return lib


def allocations(
    python: str | None, lib: Path, tmp: Path, inputs: dict[str, Any], n: int, tcp: bool = True
) -> dict[str, float]:
    """Heap allocations per request of the server process on the TCP (unless not ``tcp``) and
    HTTP paths."""
    counter_file = tmp / f"count-{os.getpid()}-{time.monotonic_ns()}"
    counter_file.write_bytes(bytes(4096))
    env = {
        **os.environ,
        "PYTHONMALLOC": "malloc",
        "LD_PRELOAD": str(lib),
        "LRT_ALLOC_COUNTER_FILE": str(counter_file),
    }
    out: dict[str, float] = {}
    with open(counter_file, "r+b") as f, mmap.mmap(f.fileno(), 4096) as shared:

        def read() -> int:
            return int(struct.unpack_from("<Q", shared)[0])

        with lumenrt_server(python, env) as server:
            for name, make in (("tcp", tcp_measure), ("http", http_measure)):
                if name == "tcp" and not tcp:
                    continue
                measure, close = make(server.ports[name], inputs)
                try:
                    measure(2000)
                    time.sleep(0.3)  # let background work settle
                    before = read()
                    measure(n)
                    out[name] = round((read() - before) / n, 1)
                finally:
                    close()
    counter_file.unlink()
    return out


MODEL_CALL = """
import mmap, struct, sys
import numpy as np, onnxruntime as ort
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
sess = ort.InferenceSession(sys.argv[1], sess_options=so, providers=["CPUExecutionProvider"])
name = sess.get_inputs()[0].name
x = np.load(sys.argv[2])
n = int(sys.argv[4])
with open(sys.argv[3], "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
    for _ in range(2000):
        sess.run(None, {name: x})
    before = struct.unpack_from("<Q", m)[0]
    for _ in range(n):
        sess.run(None, {name: x})
    print((struct.unpack_from("<Q", m)[0] - before) / n)
"""


def model_call_allocations(lib: Path, tmp: Path, model_path: Path, inputs: dict[str, Any], n: int) -> float:
    """Heap allocations of one bare ONNX Runtime ``session.run`` of the same model and input (the
    part of a request no server can avoid), counted the same way."""
    counter_file = tmp / "count-model"
    counter_file.write_bytes(bytes(4096))
    (array,) = inputs.values()
    np.save(tmp / "x.npy", array)
    env = {**os.environ, "PYTHONMALLOC": "malloc", "LD_PRELOAD": str(lib)}
    env["LRT_ALLOC_COUNTER_FILE"] = str(counter_file)
    cmd = [sys.executable, "-c", MODEL_CALL, str(model_path), str(tmp / "x.npy"), str(counter_file), str(n)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return round(float(done.stdout.strip().splitlines()[-1]), 1)


# ---- 4. throughput --------------------------------------------------------------------------------


LOAD_REPEATS = 3  # runs per throughput row; its figures are their medians (``--load-repeats``)


def load(
    target: str,
    concurrency: int,
    seconds: float,
    out_dir: Path,
    name: str,
    *extra: str,
    model: str = MODEL,
    python: str | None = None,
    server_pid: int | None = None,
    loop_thread: bool = True,
) -> dict[str, Any]:
    """``LOAD_REPEATS`` closed-loop ``lumenrt bench load`` runs (one load process each, as the
    peer table), from ``python``'s install (default: this one); the medians of their figures.
    With ``server_pid``, also where the CPU went, per request: the server's event-loop thread
    (its main thread; ``loop_thread``), the whole server (its processes), and the load generator
    (its measured window; nan from an install that does not report it)."""
    args = ["--target", target, "--model", model, "--concurrency", str(concurrency),
            "--duration-s", str(seconds), "--warmup-s", "1", "--no-stages", "--out", str(out_dir),
            "--name", name, *extra]  # fmt: skip
    runs = [
        bench_load_cpu(*args, server_pid=server_pid, seconds=seconds, warmup_s=1.0, loop_thread=loop_thread,
                       python=python)
        if server_pid
        else load_figures(bench_load(*args, python=python))
        for _ in range(LOAD_REPEATS)
    ]  # fmt: skip
    keys = ("throughput_per_s", "p50_us", "p99_us")
    if server_pid:
        keys += CPU_COLUMNS[:3]
    return {
        **{k: round(float(np.median([r[k] for r in runs])), 1) for k in keys},
        "errors": sum(int(r["errors"]) for r in runs),
        "rounds_throughput_per_s": [round(r["throughput_per_s"], 1) for r in runs],
    }


CPU_COLUMNS = ("loop_cpu_us", "server_cpu_us", "client_cpu_us", "cpu_bound_per_s")


def cpu_bound(row: dict[str, Any], cpus: int) -> float | None:
    """The throughput ``cpus`` CPUs allow at the row's CPU cost per request (server + load
    generator); None when either is unknown. A row that reaches it is CPU-bound."""
    spent_us = row.get("server_cpu_us", math.nan) + row.get("client_cpu_us", math.nan)
    return round(cpus * 1e6 / spent_us, 1) if spent_us > 0 else None


# ---- 5. SqueezeNet -----------------------------------------------------------------------------


def squeezenet(out_dir: Path, seconds: float, workers: int = 0) -> dict[str, Any]:
    """SqueezeNet batch 1 through each protocol at concurrency 1, 2, 4, 8, against the raw loop of
    the same run (2 threads, each with its own ONNX Runtime session, batch 1, no server). The
    server has a worker per usable CPU, or ``workers`` when given (2: the raw loop's compute on a
    machine of more CPUs, where the event loop and the load generator then have CPUs of their
    own). The raw loop runs three times, spread over the section (before the server starts, while
    it idles halfway, after it stops), and the ratios take the median: a single run at one moment
    of this VM's phases moved the ratios by 20% (243/s in one run against 198/s in the run before)."""
    from lumenrt.bench.engine_load import Phase, best_raw

    def raw_loop() -> float:
        return float(best_raw("latency", "squeezenet", [1], Phase(1.0, seconds)).throughput_per_s or 0.0)

    raws = [raw_loop()]
    cpus = len(os.sched_getaffinity(0))
    rows: dict[str, dict[str, Any]] = {}
    placed = ("--workers", str(workers)) if workers else ()
    with start_serve("--models", "squeezenet", "--placement", "roundrobin", *placed, cwd=str(ROOT)) as s:
        meta = ("--metadata-url", f"http://{s.http_url}")
        targets = {
            "TCP": f"tcp://127.0.0.1:{s.ports['tcp']}",
            "HTTP binary": f"http://{s.http_url}",
            "gRPC": f"grpc://{s.grpc_url}",
        }
        for c in (1, 2, 4, 8):
            if c == 4:
                raws.append(raw_loop())  # the server idles meanwhile (its workers sleep)
            for proto, target in targets.items():
                row: dict[str, Any] = load(
                    target,
                    c,
                    seconds,
                    out_dir,
                    f"squeezenet-{proto}-c{c}",
                    *meta,
                    model="squeezenet",
                    server_pid=s.proc.pid,
                )
                row["cpu_bound_per_s"] = cpu_bound(row, cpus)
                row["p99/p50"] = round(row["p99_us"] / row["p50_us"], 2) if row["p50_us"] else None
                rows[f"{proto} c{c}"] = row
    raws.append(raw_loop())
    raw_per_s = float(np.median(raws))
    for row in rows.values():
        row["x raw"] = round(row["throughput_per_s"] / raw_per_s, 3) if raw_per_s else None
    rows = {
        "raw loop (2 sessions, batch 1)": {
            "throughput_per_s": round(raw_per_s, 1),
            "rounds_throughput_per_s": [round(r, 1) for r in raws],
        },
        **rows,
    }
    cols = ("throughput_per_s", "x raw", "p50_us", "p99_us", "p99/p50", "rounds_throughput_per_s")
    print(markdown_table("SqueezeNet batch 1 (closed loop)", rows, cols))
    title = (
        "SqueezeNet: CPU µs per request (the server's event loop, the whole server, the load generator),"
        f" and the throughput {cpus} CPUs allow at that cost"
    )
    print(markdown_table(title, rows, CPU_COLUMNS))
    return rows


# ---- the run ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    global LOAD_REPEATS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=5000, help="requests per row per round (default 5000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; figures are their medians")
    p.add_argument("--baseline-python", help="a python whose lumenrt is the baseline (another venv)")
    p.add_argument(
        "--fastapi-python",
        type=Path,
        default=DEFAULT_FASTAPI,
        help="python with fastapi, uvicorn, onnxruntime, numpy (default: .venv-fastapi, created "
        "with the peer benchmark's pins if missing)",
    )
    p.add_argument("--no-fastapi", action="store_true", help="leave out the FastAPI rows")
    p.add_argument("--alloc-n", type=int, default=10000, help="requests counted per path (default 10000)")
    p.add_argument("--load-s", type=float, default=5.0, help="seconds per throughput run (default 5)")
    p.add_argument(
        "--load-repeats",
        type=int,
        default=LOAD_REPEATS,
        help="runs per throughput row, medians kept (default 3)",
    )
    p.add_argument(
        "--skip", default="", help="comma list of sections to skip: rtt,stages,load,squeezenet,alloc"
    )
    p.add_argument(
        "--squeezenet-workers",
        type=int,
        default=0,
        help="SqueezeNet's server workers (default: one per usable CPU); 2 matches the raw loop's "
        "2 sessions on a machine of more CPUs",
    )
    p.add_argument(
        "--loop-spin-us",
        type=int,
        default=0,
        help="also measure a server given `--loop-spin-us N` (rows 'lumenrt spin': round trips, "
        "TCP c8 and HTTP loads), beside the default one",
    )
    p.add_argument("--out", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    LOAD_REPEATS = max(1, args.load_repeats)
    skip = set(filter(None, args.skip.split(",")))
    idle_note = halts_at_once(read_cpu_idle())
    if idle_note is not None:  # the c1 rows pay it, every server alike (benchmarks/cpu_idle.py)
        print(f"note: {idle_note}", file=sys.stderr)
    inputs = builtin_examples(MODEL, 1)
    model_path = ensure_builtin_repository() / MODEL / "1" / "model.onnx"
    if args.fastapi_python == DEFAULT_FASTAPI and not args.no_fastapi:
        fastapi_venv()  # created (or brought up to its pins) as the peer benchmark does
    fastapi = args.fastapi_python if args.fastapi_python.exists() and not args.no_fastapi else None
    if fastapi is None:
        print(f"note: no FastAPI interpreter at {args.fastapi_python}: FastAPI rows skipped", file=sys.stderr)
    base = args.baseline_python
    result: dict[str, Any] = {"model": MODEL, "n": args.n, "repeats": args.repeats, "baseline": base}
    servers = {"lumenrt": None, **({"baseline": base} if base else {})}
    extras: dict[str, tuple[str, ...]] = {}
    if args.loop_spin_us:
        servers["lumenrt spin"] = None
        extras["lumenrt spin"] = ("--loop-spin-us", str(args.loop_spin_us))
        result["loop_spin_us"] = args.loop_spin_us
    # the load runs' own files (a summary and a CSV each) and the FastAPI input: not results (the
    # folder goes when main returns, or at exit)
    scratch_dir = tempfile.TemporaryDirectory(prefix="lumenrt-latency-")
    scratch = Path(scratch_dir.name)
    with contextlib.ExitStack() as stack:
        running = {
            label: stack.enter_context(lumenrt_server(py, extra=extras.get(label, ())))
            for label, py in servers.items()
        }
        api_port = stack.enter_context(fastapi_server(fastapi, model_path, 1))[0] if fastapi else None
        tcp_ok = {label for label, server in running.items() if speaks_our_tcp(server.ports["tcp"], inputs)}
        # this install's servers and their ratios' prefixes
        ours = {label: "" if label == "lumenrt" else "spin " for label in LUMENRT_ROWS if label in running}
        for label in set(running) - tcp_ok:
            print(f"note: {label} speaks another TCP protocol version: its TCP round trips, stages and "
                  "allocations are left out; its TCP load runs through its own load generator", file=sys.stderr)  # fmt: skip
        if "rtt" not in skip:
            rows: dict[str, Measure] = echo_floors(stack, running["lumenrt"], inputs)
            closers: list[Callable[[], None]] = []
            grpc_answer = grpc_echo_response(running["lumenrt"].ports["grpc"], inputs)
            grpc_echo = _Child(_grpc_echo_main, (grpc_answer,), "lumenrt-grpc-echo")
            stack.callback(grpc_echo.stop)
            measure, close = grpcio_measure(grpc_echo.port, inputs)
            rows["grpcio echo floor"] = measure
            closers.append(close)
            measure, close = grpcio_measure(running["lumenrt"].ports["grpc"], inputs)
            rows["lumenrt gRPC, grpcio client"] = measure
            closers.append(close)
            for label, server in running.items():
                for proto, make in (
                    ("TCP", tcp_measure),
                    ("HTTP binary", http_measure),
                    ("gRPC", grpc_measure),
                ):
                    if proto == "TCP" and label not in tcp_ok:
                        continue
                    measure, close = make(server.ports[proto.split()[0].lower()], inputs)
                    rows[f"{label} {proto}"] = measure
                    closers.append(close)
            if api_port is not None:
                measure, close = fastapi_measure(api_port, inputs)
                rows["FastAPI inline (1 worker)"] = measure
                closers.append(close)
            rtt = round_trips(rows, args.n, args.repeats)
            for close in closers:
                close()
            result["round_trips"] = rtt
            print(
                markdown_table(
                    "c1 round trips (us; medians of rounds)", rtt, ("p50_us", "p99_us", "rounds_p50_us")
                )
            )
            ratios = {}
            if "FastAPI inline (1 worker)" in rtt:
                fa = rtt["FastAPI inline (1 worker)"]["p50_us"]
                for label, prefix in ours.items():
                    ratios[f"{prefix}tcp_p50_over_fastapi"] = round(rtt[f"{label} TCP"]["p50_us"] / fa, 3)
                    ratios[f"{prefix}http_p50_over_fastapi"] = round(
                        rtt[f"{label} HTTP binary"]["p50_us"] / fa, 3
                    )
            ratios["tcp_p50_over_echo"] = round(rtt["lumenrt TCP"]["p50_us"] / rtt["echo floor"]["p50_us"], 3)
            ratios["http_p50_over_http_echo"] = round(
                rtt["lumenrt HTTP binary"]["p50_us"] / rtt["HTTP echo floor"]["p50_us"], 3
            )
            ratios["grpc_p50_over_http"] = round(
                rtt["lumenrt gRPC"]["p50_us"] / rtt["lumenrt HTTP binary"]["p50_us"], 3
            )
            ratios["grpcio_echo_p50_over_http"] = round(
                rtt["grpcio echo floor"]["p50_us"] / rtt["lumenrt HTTP binary"]["p50_us"], 3
            )
            ratios["grpcio_client_grpc_p50_over_http"] = round(
                rtt["lumenrt gRPC, grpcio client"]["p50_us"] / rtt["lumenrt HTTP binary"]["p50_us"], 3
            )
            for label, prefix in ours.items():
                for proto in ("TCP", "HTTP binary", "gRPC"):
                    r = rtt[f"{label} {proto}"]
                    ratios[f"{prefix}{proto} p99/p50"] = round(r["p99_us"] / r["p50_us"], 3)
            result["ratios"] = ratios
            print(json.dumps(ratios, indent=1))
        if "stages" not in skip:
            st = {
                label: tcp_stages(s.ports["tcp"], inputs, args.n)
                for label, s in running.items()
                if label in tcp_ok
            }
            result["stages"] = st
            cols = (
                "round_trip_us",
                "engine_us",
                "outside_engine_us",
                "queue_us",
                "batch_us",
                "compute_us",
                "return_us",
            )
            print(markdown_table("stages of one TCP request (medians, us)", st, cols))
        if "load" not in skip:
            tput: dict[str, dict[str, Any]] = {}
            for label, s in running.items():  # each through its own install's load generator
                tput[f"{label} TCP c8"] = load(f"tcp://127.0.0.1:{s.ports['tcp']}", 8, args.load_s, scratch,
                                               f"{label.replace(' ', '-')}-tcp-c8", "--metadata-url", f"http://{s.http_url}",
                                               python=servers[label], server_pid=s.proc.pid)  # fmt: skip
            s = running["lumenrt"]
            for c in (1, 4, 8):
                for label in ours:
                    srv = running[label]
                    tput[f"{label} HTTP c{c}"] = load(
                        f"http://{srv.http_url}",
                        c,
                        args.load_s,
                        scratch,
                        f"{label.replace(' ', '-')}-http-c{c}",
                        server_pid=srv.proc.pid,
                    )
                tput[f"lumenrt gRPC c{c}"] = load(f"grpc://{s.grpc_url}", c, args.load_s, scratch,
                                                  f"lumenrt-grpc-c{c}", "--metadata-url", f"http://{s.http_url}",
                                                  server_pid=s.proc.pid)  # fmt: skip
            result["throughput"] = tput
    if "load" not in skip and fastapi is not None:  # FastAPI with 2 workers, as in the peer table
        with fastapi_server(fastapi, model_path, 2) as (port2, api_pid):
            (array,) = inputs.values()
            raw = scratch / "digits_mlp-input.npy"
            np.save(raw, array)
            for c in (1, 4, 8):
                target = f"http-raw://127.0.0.1:{port2}/predict/{MODEL}"
                tput[f"FastAPI 2 workers c{c}"] = load(target, c, args.load_s, scratch, f"fastapi-c{c}",
                                                      "--input-file", str(raw), server_pid=api_pid,
                                                      loop_thread=False)  # fmt: skip
    if "load" not in skip:
        print(
            markdown_table(
                "throughput (closed loop; medians of runs)",
                tput,
                ("throughput_per_s", "p50_us", "p99_us", "errors", "rounds_throughput_per_s"),
            )
        )
        cpus = len(os.sched_getaffinity(0))
        for row in tput.values():
            row["cpu_bound_per_s"] = cpu_bound(row, cpus)
        title = f"the same runs: CPU µs per request, and the throughput {cpus} CPUs allow at that cost"
        print(markdown_table(title, tput, CPU_COLUMNS))
    if "squeezenet" not in skip:
        result["squeezenet"] = squeezenet(scratch, args.load_s, args.squeezenet_workers)
        result["squeezenet_workers"] = args.squeezenet_workers or "one per usable CPU"
    if "alloc" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            lib = build_counter(Path(tmp))
            allocs = {
                label: allocations(py, lib, Path(tmp), inputs, args.alloc_n, tcp=label in tcp_ok)
                for label, py in servers.items()
                if label not in extras
            }
            model_call = model_call_allocations(lib, Path(tmp), model_path, inputs, args.alloc_n)
        for row in allocs.values():
            row["model call"] = model_call
            if "tcp" in row:
                row["tcp - model call"] = round(row["tcp"] - model_call, 1)
            row["http - model call"] = round(row["http"] - model_call, 1)
        result["allocations_per_request"] = allocs
        cols = ("tcp", "http", "model call", "tcp - model call", "http - model call")
        print(
            markdown_table(
                "heap allocations per request (server process; model call: bare session.run)", allocs, cols
            )
        )
    head = {"kind": "latency", "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = write_result(
        args.out, "latency", {**head, "machine": machine_info(), "commit": git_commit(), **result}
    )
    print(f"\nwrote {path}")
    scratch_dir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
