"""Latency and throughput of the FP32 and the INT8 model, measured in the same run, in turns.

Both run in ONNX Runtime sessions made with the onnxruntime backend's ``session_options`` (the
optimization level, spinning and execution mode the server gives a worker, and the model config's
``parameters.onnxruntime``), with the same intra-op thread count and no pinning. A measurement is
a closed loop on the calling thread: a run's latency is ``perf_counter_ns`` around
``session.run``; throughput is the samples run over the time the runs took.

A neighbour's load on a shared machine drifts over seconds, so each measurement is cut into
``ROUNDS`` turns that alternate between the models (ABBA: the one going first alternates), and
each model's turns are pooled: both see the same drift.
"""

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROUNDS = 4  # guessed: enough turns to share a few seconds' drift
WARMUP_RUNS = 3  # guessed: ORT allocates its buffers in the first run; two more settle the caches


@dataclass(frozen=True, slots=True)
class Timing:
    batch: int
    runs: int
    p50_us: float
    p99_us: float
    per_s: float  # samples (not runs) per second

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "p50_us": self.p50_us, "p99_us": self.p99_us, "per_s": self.per_s}


def make_session(path: Path, threads: int, options: Any, source: str) -> Any:
    """An InferenceSession as a server worker would get it, with ``threads`` intra-op threads."""
    import onnxruntime as ort

    from lumenrt.backends.base import Placement
    from lumenrt.backends.onnxruntime_backend import session_options

    so = session_options(Placement(cores=(), intra_op_threads=threads), options, source)
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def measure(
    sessions: Mapping[str, Any], feed: Mapping[str, npt.NDArray[Any]], seconds: float, rounds: int = ROUNDS
) -> dict[str, Timing]:
    """Each session run on ``feed`` for about ``seconds`` in all (at least one run a turn)."""
    batch = len(next(iter(feed.values())))
    feeds = {k: np.ascontiguousarray(v) for k, v in feed.items()}
    for session in sessions.values():
        for _ in range(WARMUP_RUNS):
            session.run(None, feeds)
    latencies: dict[str, list[int]] = {name: [] for name in sessions}
    turn_ns = int(seconds / rounds * 1e9)
    order = list(sessions)
    for turn in range(rounds):
        for name in order if turn % 2 == 0 else reversed(order):
            run, record = sessions[name].run, latencies[name].append
            end = time.perf_counter_ns() + turn_ns
            while True:
                start = time.perf_counter_ns()
                run(None, feeds)
                done = time.perf_counter_ns()
                record(done - start)
                if done >= end:
                    break
    return {name: _timing(batch, samples) for name, samples in latencies.items()}


def _timing(batch: int, latencies_ns: list[int]) -> Timing:
    values = np.asarray(latencies_ns, dtype=np.float64)
    p50, p99 = np.percentile(values, [50.0, 99.0]) / 1000.0
    return Timing(
        batch=batch,
        runs=len(values),
        p50_us=round(float(p50), 1),
        p99_us=round(float(p99), 1),
        per_s=round(batch * len(values) / (float(values.sum()) / 1e9), 1),
    )
