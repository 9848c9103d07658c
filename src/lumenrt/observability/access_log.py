"""The structured access log: one JSON line per answered request, written off the hot path.

The request path (the event-loop thread, ``InferenceService._count``) calls ``AccessLog.record``:
it builds one small slotted record of plain ints and strings and appends it to a bounded deque. No
I/O, no JSON, no lock there. A writer thread wakes every ``FLUSH_INTERVAL_S``, drains the deque,
turns each record into a JSON line (and, with ``--trace``, into spans: ``tracing.py``), and writes
them in one call. A line::

    {"ts": "2026-11-23T20:41:07.123456Z", "id": "lrt-3f2a-17", "model": "digits_mlp", "version": 1,
     "protocol": "http", "status": 200, "queue_us": 41, "compute_us": 12, "engine_us": 70,
     "total_us": 95, "batch_size": 1}

``id``: the client's (the V2 request ``id``; the TCP frame's request id, unique per connection);
a request without one gets ``<process prefix>-<counter>``, made by the writer, not the request path.

Invariants:
1. Only the event-loop thread calls ``record`` (the one producer); only the writer thread pops
   (the one consumer). ``deque.append`` and ``popleft`` are atomic under the GIL, so the two never
   need a lock; ``len`` may be stale by the records in flight, so the bound is approximate by at
   most the one record being appended.
2. ``_dropped`` is written by the producer only, ``_reported`` by the writer only: the writer logs
   ``dropped - reported`` as one line when records flow again and then catches up ``_reported``.
3. Every record appended before ``close`` is written: close stops the thread, then drains once
   more on the closing thread, with the thread already joined (so one consumer still).

Shutdown order (``close``; every exit path of ``lumenrt serve`` reaches it via ``finally``):
1. The server stops answering (its front ends closed, so no more ``record`` calls).
2. ``_stop`` is set, waking the writer from its wait; the writer drains once more and exits.
3. The thread is joined; whatever was appended meanwhile is drained on the closing thread.
4. The span sink (if any) is flushed and shut down; the output is flushed and, if we opened it,
   closed.
"""

import collections
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

# Guessed: a 50 ms cadence keeps the writer's wake-ups (20/s) negligible next to a request path
# of tens of µs, and 8192 records cover 50 ms at 160k requests/s, beyond what one event loop serves.
FLUSH_INTERVAL_S = 0.05
# One access-log line; the same text as json.dumps of AccessLog._line with separators (", ", ": ").
_LINE = (
    '{"ts": "%s", "id": %s, "model": %s, "version": %d, "protocol": "%s", "status": %d, '
    '"queue_us": %d, "compute_us": %d, "engine_us": %d, "total_us": %d, "batch_size": %d}'
)
DEFAULT_CAPACITY = 8192


@dataclass(slots=True)
class AccessRecord:
    """One answered request: CLOCK_MONOTONIC ns (0 = stage not reached) and what identifies it."""

    model: str
    version: int
    protocol: str
    status: int  # HTTP-style code of the answer
    request_id: str | int | None  # the client's id; None: the writer makes one
    start_ns: int  # received by the front end
    end_ns: int  # answer handed to the front end
    enqueued_ns: int = 0
    dequeued_ns: int = 0
    compute_start_ns: int = 0
    compute_end_ns: int = 0
    completed_ns: int = 0
    batch_size: int = 0


class StageTimesLike(Protocol):
    """What ``record`` reads of ``engine.request.StageTimes`` (copied: the lane reuses its own)."""

    enqueued_ns: int
    dequeued_ns: int
    compute_start_ns: int
    compute_end_ns: int
    completed_ns: int
    batch_size: int


class SpanSink(Protocol):
    """Something else made from each record in the writer thread (``tracing.SpanExporter``)."""

    def add(self, record: AccessRecord, request_id: str, wall_offset_ns: int) -> None: ...

    def close(self) -> None: ...


def span_us(start_ns: int, end_ns: int) -> int:
    """Whole µs from ``start_ns`` to ``end_ns``; 0 when either stage was not reached."""
    return (end_ns - start_ns) // 1000 if start_ns and end_ns >= start_ns else 0


class RequestIds:
    """Ids for requests that came without one: ``<prefix>-<n>``; the prefix is per process (pid and
    a random part, so two servers' logs do not collide). Not thread-safe: the writer's alone."""

    def __init__(self) -> None:
        self.prefix = f"lrt{os.getpid():x}{os.urandom(2).hex()}"
        self._next = itertools.count(1)

    def new(self) -> str:
        return f"{self.prefix}-{next(self._next)}"


class AccessLog:
    """The deque, its writer thread and the outputs: JSON lines to ``out`` (None: no access log,
    e.g. only traces) and records to ``spans`` (None: no traces)."""

    def __init__(
        self,
        out: TextIO | None,
        *,
        spans: SpanSink | None = None,
        close_out: bool = False,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self._out = out
        self._close_out = close_out
        self._spans = spans
        self._capacity = capacity
        self._interval_s = flush_interval_s
        self._records: collections.deque[AccessRecord] = collections.deque()
        self._dropped = 0  # producer-owned (invariant 2)
        self._reported = 0  # writer-owned
        self.ids = RequestIds()
        self._models: dict[str, str] = {}  # model name -> as a JSON string (writer-owned)
        self._ts_second, self._ts_prefix = -1, ""  # writer-owned
        # CLOCK_MONOTONIC -> wall clock, taken once (records carry monotonic times)
        self.wall_offset_ns = time.time_ns() - time.monotonic_ns()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="lumenrt-access-log", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, path: str | None, *, spans: SpanSink | None = None) -> "AccessLog":
        """``path``: a file (appended to), ``-`` for stderr, None for no JSON lines (spans only)."""
        if path is None:
            return cls(None, spans=spans)
        if path == "-":
            return cls(sys.stderr, spans=spans)
        return cls(open(path, "a", encoding="utf-8"), spans=spans, close_out=True)

    @property
    def dropped(self) -> int:
        """Records dropped so far because the deque was full."""
        return self._dropped

    def record(
        self,
        model: str,
        version: int,
        protocol: str,
        status: int,
        request_id: str | int | None,
        start_ns: int,
        end_ns: int,
        times: StageTimesLike | None = None,
    ) -> None:
        """One answered request (event-loop thread only; invariant 1). Never blocks, never writes."""
        if len(self._records) >= self._capacity:
            self._dropped += 1
            return
        r = AccessRecord(model, version, protocol, status, request_id, start_ns, end_ns)
        if times is not None:
            r.enqueued_ns, r.dequeued_ns = times.enqueued_ns, times.dequeued_ns
            r.compute_start_ns, r.compute_end_ns = times.compute_start_ns, times.compute_end_ns
            r.completed_ns, r.batch_size = times.completed_ns, times.batch_size
        self._records.append(r)

    def close(self) -> None:
        """Write everything recorded, stop the writer, flush and close (see "Shutdown order")."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        self._drain()
        if self._spans is not None:
            self._spans.close()
        if self._out is not None:
            self._out.flush()
            if self._close_out:
                self._out.close()

    def __enter__(self) -> "AccessLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        lines: list[str] = []
        records = self._records
        while records:
            r = records.popleft()
            rid = self.ids.new() if r.request_id is None or r.request_id == "" else str(r.request_id)
            if self._out is not None:
                lines.append(self._format(r, rid, r.request_id is None or r.request_id == ""))
            if self._spans is not None:
                self._spans.add(r, rid, self.wall_offset_ns)
        dropped = self._dropped - self._reported
        if dropped:
            self._reported += dropped
            if self._out is not None:
                event = {"ts": self._ts(time.time_ns()), "event": "access_log_dropped", "dropped": dropped}
                lines.append(json.dumps(event, separators=(", ", ": ")))
        if lines and self._out is not None:
            self._out.write("\n".join(lines) + "\n")
            self._out.flush()

    def _format(self, r: AccessRecord, rid: str, generated: bool) -> str:
        """``_line`` as ``json.dumps(..., separators=(", ", ": "))`` writes it, formatted directly:
        the writer's cost per request, which at thousands of requests/s competes with the event
        loop for the GIL. Strings a client chose (its id) and model names are JSON-escaped; a
        generated id and the protocol are plain ASCII."""
        model = self._models.get(r.model)
        if model is None:
            model = self._models[r.model] = json.dumps(r.model)
        return _LINE % (
            self._ts(r.start_ns + self.wall_offset_ns),
            f'"{rid}"' if generated else json.dumps(rid),
            model,
            r.version,
            r.protocol,
            r.status,
            span_us(r.enqueued_ns, r.dequeued_ns),
            span_us(r.compute_start_ns, r.compute_end_ns),
            span_us(r.enqueued_ns or r.start_ns, r.completed_ns),
            span_us(r.start_ns, r.end_ns),
            r.batch_size,
        )

    def _line(self, r: AccessRecord, rid: str) -> dict[str, Any]:
        return {
            "ts": self._ts(r.start_ns + self.wall_offset_ns),
            "id": rid,
            "model": r.model,
            "version": r.version,
            "protocol": r.protocol,
            "status": r.status,
            "queue_us": span_us(r.enqueued_ns, r.dequeued_ns),
            "compute_us": span_us(r.compute_start_ns, r.compute_end_ns),
            "engine_us": span_us(r.enqueued_ns or r.start_ns, r.completed_ns),
            "total_us": span_us(r.start_ns, r.end_ns),
            "batch_size": r.batch_size,
        }

    def _ts(self, wall_ns: int) -> str:
        """RFC 3339 UTC with µs (the date and time to the second made once per second)."""
        seconds, ns = divmod(wall_ns, 1_000_000_000)
        if seconds != self._ts_second:
            self._ts_second = seconds
            self._ts_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        return f"{self._ts_prefix}.{ns // 1000:06d}Z"
