"""What the connection-density benchmarks measure (``connections.py``, ``uring/uring_compare.py``):
a bounded load through ``lumenrt bench load``'s own loop, and a server process's memory and
descriptors from /proc.

The load runs in the calling process (apart from the server and from the idle crowd), open loop at
a constant rate by default: the same load with and without a crowd, and a stall shows in the
latency of every request scheduled during it (no coordinated omission). Its figures are those
``lumenrt bench load`` writes (``load_stats.summarize``), without the files.
"""

import multiprocessing
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lumenrt.bench.load_run import LoadPlan, run_load
from lumenrt.bench.load_stats import summarize

MODEL = "digits_mlp"


@dataclass(frozen=True, slots=True)
class Load:
    """One bounded run: open loop at ``rate_per_s`` (None: closed loop at ``concurrency``)."""

    rate_per_s: float | None = 1000.0
    concurrency: int = 4
    duration_s: float = 5.0
    warmup_s: float = 1.0
    connections: int = 8  # open loop: the load's own connections (closed loop: one per client)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def run(
    target: str, inputs: Mapping[str, Any], load: Load, *, model: str = MODEL, stages: bool = True
) -> dict[str, Any]:
    """Drive ``target`` (tcp://H:P, http://H:P) with ``load``: counts, throughput, latency (µs)."""
    plan = LoadPlan(
        target=target,
        model=model,
        inputs=inputs,
        mode="closed" if load.rate_per_s is None else "open",
        concurrency=load.concurrency,
        rate_per_s=load.rate_per_s or 0.0,
        warmup_s=load.warmup_s,
        duration_s=load.duration_s,
        connections=None if load.rate_per_s is None else load.connections,
        stages=stages,
    )
    progress = multiprocessing.RawArray("q", 1)
    records, window = run_load(plan, progress)
    figures = summarize(records.arrays(), window)
    return {k: figures[k] for k in ("counts", "elapsed_s", "throughput_per_s", "latency_us", "send_lag_us")}


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon of ``pid`` in KiB (/proc/PID/status)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                out[key] = int(value.split()[0])
    return out


def open_fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_limit(pid: int) -> int | None:
    """The soft open-file limit of ``pid`` (None: unlimited)."""
    with open(f"/proc/{pid}/limits", encoding="ascii") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return None if soft == "unlimited" else int(soft)
    raise RuntimeError(f"/proc/{pid}/limits has no 'Max open files' line")
