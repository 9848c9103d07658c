"""System shared memory against the tensor bytes in the request: SqueezeNet, batch 1, concurrency 1.

    .venv/bin/python benchmarks/shared_memory.py [--model squeezenet] [--n 300] [--repeats 3]
        [--no-perf-analyzer] [--out results/]

Starts ``lumenrt serve --allow-client-shm --models MODEL`` and measures, in one run:

1. **Round trips** (keep-alive ``http.client`` for HTTP, one grpc channel with the generated
   ModelInfer stub for gRPC), one request of each row in turn, ``--n`` turns a round (so that the
   machine's drift meets every row alike), ``--repeats`` rounds; each figure is the median of the
   rounds' p50 (p99):
   - *HTTP binary*: the V2 binary tensor extension, the input's bytes in the body (built once);
   - *HTTP shm*: the input and output in registered regions, a JSON body that names them;
   - *gRPC raw* and *gRPC shm*: the same two on gRPC.
   A shm row's client writes the input into its region before each request (what a client that
   gets its tensors from elsewhere pays; the "input in place" rows do not: a producer that makes
   its tensors in the region) and copies the output out after it; the binary rows' clients send a
   body built once.
2. **perf_analyzer** (Triton's, unchanged; skipped when it cannot run here), HTTP and gRPC, with and
   without ``--shared-memory system``: its client-side p50/p99 and throughput.

Prints the tables and writes ``shared-memory-<stamp>.json``.
"""

import argparse
import http.client
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve
from lumenrt.client.http import encode_infer
from lumenrt.models.builtin import builtin_examples
from roundtrip import markdown_table, stats  # beside this file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
One = Callable[[], object]  # one request, answered
WARMUP = 30


class Region:
    """A client's POSIX shared-memory object (shm_open + ftruncate + mmap, as tritonclient makes one)."""

    def __init__(self, key: str, byte_size: int) -> None:
        import mmap

        self.key = key
        self.path = os.path.join("/dev/shm", key.lstrip("/"))
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self.map = mmap.mmap(fd, byte_size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.map, np.uint8)

    def close(self) -> None:
        os.unlink(self.path)
        del self.array
        self.map.close()


def _post(conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    conn.request("POST", path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"POST {path}: {resp.status} {data[:300]!r}")
    return data


def _connect(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def http_binary(port: int, model: str, inputs: dict[str, Any]) -> tuple[One, Callable[[], None]]:
    req = encode_infer(model, inputs)
    conn = _connect(port)
    headers = dict(req.headers)
    return (lambda: _post(conn, req.path, req.body, headers)), conn.close


def _shm_doc(inputs: dict[str, Any], output: tuple[str, int]) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": [], "outputs": []}
    offset = 0
    for name, array in inputs.items():
        doc["inputs"].append(
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(array.shape),
                "parameters": {
                    "shared_memory_region": "lrt-bench-in",
                    "shared_memory_offset": offset,
                    "shared_memory_byte_size": array.nbytes,
                },
            }
        )
        offset += array.nbytes
    name, size = output
    doc["outputs"].append(
        {
            "name": name,
            "parameters": {"shared_memory_region": "lrt-bench-out", "shared_memory_byte_size": size},
        }
    )
    return doc


def _fill(region: Region, inputs: dict[str, Any]) -> None:
    """The client puts its input into its region (one copy, as a client that got it elsewhere)."""
    offset = 0
    for array in inputs.values():
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        region.array[offset : offset + raw.size] = raw
        offset += raw.size


def _through_regions(
    send: One, regions: tuple[Region, Region], inputs: dict[str, Any], size: int, fill: bool
) -> One:
    """One request whose tensors lie in ``regions``: the input written first (``fill``; else once,
    now), the answer's output copied out after."""
    into, out = regions

    def one() -> None:
        if fill:
            _fill(into, inputs)
        send()
        out.array[:size].copy()  # the client reads its answer

    _fill(into, inputs)
    return one


def http_shm(
    port: int,
    model: str,
    inputs: dict[str, Any],
    output: tuple[str, int],
    regions: tuple[Region, Region],
    fill: bool,
) -> tuple[One, Callable[[], None]]:
    conn = _connect(port)
    body = json.dumps(_shm_doc(inputs, output)).encode()
    path = f"/v2/models/{model}/infer"
    headers = {"Content-Type": "application/json"}
    size = output[1]

    return _through_regions(lambda: _post(conn, path, body, headers), regions, inputs, size, fill), conn.close


def _grpc_call(port: int) -> tuple[Any, Any, Any]:
    import grpc
    import lumenrt.protocols.proto.grpc_service_pb2 as pb

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    return pb, channel, call


def grpc_raw(port: int, model: str, inputs: dict[str, Any]) -> tuple[One, Callable[[], None]]:
    pb, channel, call = _grpc_call(port)
    request = pb.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return (lambda: call(request, timeout=30)), channel.close


def grpc_shm(
    port: int,
    model: str,
    inputs: dict[str, Any],
    output: tuple[str, int],
    regions: tuple[Region, Region],
    fill: bool,
) -> tuple[One, Callable[[], None]]:
    pb, channel, call = _grpc_call(port)
    request = pb.ModelInferRequest(model_name=model)
    doc = _shm_doc(inputs, output)
    for entry in doc["inputs"]:
        tensor = request.inputs.add(name=entry["name"], datatype="FP32", shape=entry["shape"])
        params = entry["parameters"]
        tensor.parameters["shared_memory_region"].string_param = params["shared_memory_region"]
        tensor.parameters["shared_memory_offset"].int64_param = params["shared_memory_offset"]
        tensor.parameters["shared_memory_byte_size"].int64_param = params["shared_memory_byte_size"]
    wanted = request.outputs.add(name=output[0])
    wanted.parameters["shared_memory_region"].string_param = "lrt-bench-out"
    wanted.parameters["shared_memory_byte_size"].int64_param = output[1]
    size = output[1]

    return _through_regions(lambda: call(request, timeout=30), regions, inputs, size, fill), channel.close


def round_trips(rows: dict[str, One], n: int, repeats: int) -> dict[str, dict[str, Any]]:
    """Every row's request in turn, ``n`` turns a round (so the machine's drift meets every row
    alike), ``repeats`` rounds; per row the median over rounds of p50/p99/mean."""
    clock = time.perf_counter_ns
    for one in rows.values():
        for _ in range(WARMUP):
            one()
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    for _ in range(repeats):
        times: dict[str, list[int]] = {name: [] for name in rows}
        for _ in range(n):
            for name, one in rows.items():
                t0 = clock()
                one()
                times[name].append(clock() - t0)
        for name, got in times.items():
            rounds[name].append(stats(got))
    out: dict[str, dict[str, Any]] = {}
    for name, got in rounds.items():
        out[name] = {
            key: round(float(np.median([g[key] for g in got])), 1) for key in ("p50_us", "p99_us", "mean_us")
        }
        out[name]["rounds_p50_us"] = [g["p50_us"] for g in got]
    return out


def perf_analyzer_rows(model: str, http_url: str, grpc_url: str, output_bytes: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from perf_analyzer import PerfAnalyzerError, perf_analyzer_problem, run_perf_analyzer

    problem = perf_analyzer_problem()
    if problem is not None:
        print(f"perf_analyzer rows left out: {problem}")
        return {}
    rows: dict[str, Any] = {}
    for proto, url in (("HTTP", http_url), ("gRPC", grpc_url)):
        for shm in (False, True):
            extra = (
                ["--shared-memory", "system", "--output-shared-memory-size", str(output_bytes)] if shm else []
            )
            try:
                got = run_perf_analyzer(
                    model, url, "http" if proto == "HTTP" else "grpc", 1, 3000, extra, input_data="random"
                )
            except PerfAnalyzerError as exc:
                print(f"perf_analyzer {proto} shm={shm}: {exc}")
                continue
            rows[f"perf_analyzer {proto} {'shm' if shm else 'in request'}"] = {
                k: got[k] for k in ("p50_us", "p99_us", "throughput_infer_per_s")
            }
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="squeezenet", help="a built-in model (default squeezenet)")
    p.add_argument("--n", type=int, default=300, help="requests per row per round (default 300)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; figures are their medians")
    p.add_argument("--no-perf-analyzer", action="store_true", help="leave out the perf_analyzer rows")
    p.add_argument("--out", type=Path, default=ROOT / "results", help="where the result file goes")
    args = p.parse_args(argv)
    inputs = {
        k: np.ascontiguousarray(v, dtype=np.float32) for k, v in builtin_examples(args.model, 1).items()
    }
    in_bytes = sum(a.nbytes for a in inputs.values())
    tag = f"lrt-bench-{os.getpid()}"
    regions = (Region(f"/{tag}-in", in_bytes), Region(f"/{tag}-out", 1 << 20))
    try:
        with start_serve("--allow-client-shm", "--models", args.model, cwd=str(ROOT)) as s:
            import tritonclient.http as thttp

            admin = thttp.InferenceServerClient(s.http_url)
            meta = admin.get_model_metadata(args.model)
            first = meta["outputs"][0]
            output = (first["name"], 1 << 20)
            admin.register_system_shared_memory("lrt-bench-in", regions[0].key, in_bytes)
            admin.register_system_shared_memory("lrt-bench-out", regions[1].key, 1 << 20)
            closers: list[Callable[[], None]] = []
            rows: dict[str, One] = {}
            http, grpc = s.ports["http"], s.ports["grpc"]
            for name, (one, close) in {
                "HTTP binary": http_binary(http, args.model, inputs),
                "HTTP shm": http_shm(http, args.model, inputs, output, regions, fill=True),
                "HTTP shm, input in place": http_shm(http, args.model, inputs, output, regions, fill=False),
                "gRPC raw": grpc_raw(grpc, args.model, inputs),
                "gRPC shm": grpc_shm(grpc, args.model, inputs, output, regions, fill=True),
                "gRPC shm, input in place": grpc_shm(grpc, args.model, inputs, output, regions, fill=False),
            }.items():
                rows[name] = one
                closers.append(close)
            trips = round_trips(rows, args.n, args.repeats)
            for close in closers:
                close()
            admin.unregister_system_shared_memory()
            admin.close()
            pa = (
                {}
                if args.no_perf_analyzer
                else perf_analyzer_rows(args.model, s.http_url, s.grpc_url, 1 << 16)
            )
    finally:
        for region in regions:
            region.close()
    for a, b in (("HTTP shm", "HTTP binary"), ("gRPC shm", "gRPC raw")):
        for row in (a, f"{a}, input in place"):
            trips[row]["p50 vs " + b] = round(trips[row]["p50_us"] / trips[b]["p50_us"], 3)
    print(f"{args.model}, batch 1, concurrency 1; input {in_bytes} bytes")
    print(markdown_table("Round trips (µs; medians of the rounds)", trips, ("p50_us", "p99_us", "mean_us", "p50 vs HTTP binary", "p50 vs gRPC raw", "rounds_p50_us")))  # fmt: skip
    if pa:
        print(markdown_table("perf_analyzer, concurrency 1 (its client-side figures)", pa, ("p50_us", "p99_us", "throughput_infer_per_s")))  # fmt: skip
    path = write_result(
        args.out,
        "shared-memory",
        {
            "benchmark": "shared_memory",
            "model": args.model,
            "input_bytes": in_bytes,
            "n": args.n,
            "repeats": args.repeats,
            "commit": git_commit(),
            "machine": machine_info(),
            "round_trips": trips,
            "perf_analyzer": pa,
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
