"""Priority under overload: does the high level keep its latency while the low level queues?

    .venv/bin/python benchmarks/priority_overload.py [--model sleep|squeezenet] [--overload 1.5]
        [--seconds 10] [--high-share 0.1] [--out results/]

One ``lumenrt serve`` child (thread mode, TCP) serves one model with two priority levels; an
open-loop client (requests sent at fixed intervals whatever the answers do, over 8 connections of
``AsyncTcpClient``) measures each request from send to answer:

1. **unloaded**: high-priority requests only, at a tenth of the capacity: their p50/p99;
2. **overload**: ``--overload`` x capacity, ``--high-share`` of them at priority 1, the rest at 2.

Capacity is measured first (closed loop, 16 requests in flight, low priority). Prints each class's
p50/p99, how many were refused (503: the low level's queue is bounded) and the ratio of the high
class's p99 under overload to its unloaded p99, and writes ``priority-overload-<stamp>.json``.

``--model sleep`` (the default) is a Python model whose batch-1 "compute" is a 2 ms sleep per row
(no CPU used, so on a 2-core machine the client's own CPU does not blur what the scheduler does);
``--model squeezenet`` uses the built-in ONNX model instead. Both get ``max_batch_size: 1`` and
two workers, so a high request waits at most for one request of another class to finish.
"""

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml  # type: ignore[import-untyped, unused-ignore]

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve
from lumenrt.client import InferenceError
from lumenrt.client.tcp import AsyncTcpClient
from lumenrt.models.builtin import builtin_examples, ensure_builtin_repository

SLEEP_S = 0.002  # the sleep model's service time per row (chosen: well above the server's own cost)
CONNECTIONS = 8

SLEEP_MODEL = f"""
import time


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        time.sleep({SLEEP_S} * x.shape[0])
        return {{"y": x * 2}}
"""

LEVELS = """dynamic_batching:
  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy:
    1: {max_queue_size: 256}
    2: {max_queue_size: 256}
instance_group: {count: 2}
"""


def write_repository(root: Path, model: str) -> tuple[str, dict[str, np.ndarray]]:
    """A repository holding the one model with two levels; its name and one input."""
    if model == "sleep":
        (root / "sleep" / "1").mkdir(parents=True)
        (root / "sleep" / "1" / "model.py").write_text(SLEEP_MODEL)
        (root / "sleep" / "config.yaml").write_text(
            "backend: python\nmax_batch_size: 1\n"
            "input:\n  - {name: x, datatype: FP32, dims: [16]}\n"
            "output:\n  - {name: y, datatype: FP32, dims: [16]}\n" + LEVELS
        )
        return "sleep", {"x": np.ones((1, 16), dtype=np.float32)}
    built = ensure_builtin_repository() / model
    shutil.copytree(built, root / model)
    config = yaml.safe_load((root / model / "config.yaml").read_text())
    config.update(yaml.safe_load(LEVELS), max_batch_size=1)
    (root / model / "config.yaml").write_text(yaml.safe_dump(config))
    return model, builtin_examples(model, 1)


async def closed_loop_capacity(port: int, model: str, x: dict[str, np.ndarray], seconds: float) -> float:
    clients = [AsyncTcpClient("127.0.0.1", port) for _ in range(CONNECTIONS)]
    done = 0
    end = time.monotonic() + seconds

    async def run(client: AsyncTcpClient) -> None:
        nonlocal done
        while time.monotonic() < end:
            await client.infer(model, x, priority=2)
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(run(c) for c in clients for _ in range(2)))
    rate = done / (time.monotonic() - start)
    for c in clients:
        await c.close()
    return rate


async def open_loop(
    port: int, model: str, x: dict[str, np.ndarray], rate: float, seconds: float, high_share: float
) -> dict[str, Any]:
    """Send at ``rate``/s for ``seconds``; every ``1/high_share``-th request at priority 1."""
    clients = [AsyncTcpClient("127.0.0.1", port) for _ in range(CONNECTIONS)]
    for c in clients:
        await c.connect()
    lat: dict[int, list[float]] = {1: [], 2: []}
    refused = {1: 0, 2: 0}
    failed = {1: 0, 2: 0}
    every = round(1 / high_share) if high_share > 0 else 0
    tasks: list[asyncio.Task[None]] = []

    async def one(client: AsyncTcpClient, priority: int) -> None:
        t0 = time.perf_counter()
        try:
            await client.infer(model, x, priority=priority)
        except InferenceError as e:
            (refused if e.status == 503 else failed)[priority] += 1
            return
        lat[priority].append(time.perf_counter() - t0)

    n = int(rate * seconds)
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        priority = 1 if every and i % every == 0 else 2
        tasks.append(asyncio.create_task(one(clients[i % CONNECTIONS], priority)))
    sent_s = time.perf_counter() - start
    await asyncio.gather(*tasks)
    for c in clients:
        await c.close()

    def summary(level: int) -> dict[str, Any]:
        values = np.array(lat[level]) * 1e6
        return {
            "answered": len(values),
            "refused_503": refused[level],
            "failed": failed[level],
            "p50_us": float(np.percentile(values, 50)) if len(values) else None,
            "p99_us": float(np.percentile(values, 99)) if len(values) else None,
        }

    return {"rate_per_s": rate, "offered": n, "sent_in_s": sent_s, "high": summary(1), "low": summary(2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="sleep", choices=["sleep", "squeezenet"])
    ap.add_argument("--overload", type=float, default=1.5, help="offered load / capacity (default 1.5)")
    ap.add_argument("--seconds", type=float, default=10.0, help="overload phase length (default 10)")
    ap.add_argument("--high-share", type=float, default=0.1, help="share at priority 1 (default 0.1)")
    ap.add_argument("--out", default="results", help="where the result file goes")
    args = ap.parse_args(argv)
    if not 0 < args.high_share < 1 or args.overload <= 0 or args.seconds <= 0:
        ap.error("--high-share must be in (0, 1); --overload and --seconds must be > 0")
    with tempfile.TemporaryDirectory() as tmp:
        model, x = write_repository(Path(tmp), args.model)
        with start_serve(
            "--repository", tmp, "--lane", "queue", ports={"http": 0, "grpc": 0, "tcp": 0}
        ) as srv:
            port = srv.ports["tcp"]
            capacity = asyncio.run(closed_loop_capacity(port, model, x, 3.0))
            print(f"capacity (closed loop, 16 in flight): {capacity:,.0f}/s")
            unloaded = asyncio.run(open_loop(port, model, x, capacity / 10, 5.0, 0.999))
            print(f"unloaded, high only at {capacity / 10:,.0f}/s: p50 {unloaded['high']['p50_us']:,.0f} us, p99 {unloaded['high']['p99_us']:,.0f} us")  # fmt: skip
            loaded = asyncio.run(
                open_loop(port, model, x, capacity * args.overload, args.seconds, args.high_share)
            )
    high, low = loaded["high"], loaded["low"]
    ratio = (
        high["p99_us"] / unloaded["high"]["p99_us"] if high["p99_us"] and unloaded["high"]["p99_us"] else None
    )
    print(f"overload {args.overload:g}x ({loaded['rate_per_s']:,.0f}/s offered, {args.high_share:.0%} high):")
    for name, s in (("high", high), ("low", low)):
        p50 = f"{s['p50_us']:,.0f}" if s["p50_us"] is not None else "-"
        p99 = f"{s['p99_us']:,.0f}" if s["p99_us"] is not None else "-"
        print(f"  {name:4}: answered {s['answered']:6}  refused(503) {s['refused_503']:6}  p50 {p50} us  p99 {p99} us")  # fmt: skip
    if ratio is not None:
        print(f"high p99 under overload / unloaded high p99: {ratio:.2f}x")
    path = write_result(
        args.out,
        "priority-overload",
        {
            "benchmark": "priority_overload",
            "machine": machine_info(),
            "commit": git_commit(),
            "config": vars(args) | {"connections": CONNECTIONS, "sleep_s": SLEEP_S},
            "capacity_per_s": capacity,
            "unloaded": unloaded,
            "overload": loaded,
            "high_p99_ratio": ratio,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
