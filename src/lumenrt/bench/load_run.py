"""The load generator's loops: closed loop (N clients, one request outstanding each) and open loop
(requests sent on a fixed schedule, however slow the answers), in one or more processes.

Invariants:
- Every request sent gets exactly one record: ok with its stage times, or failed with an error kind.
  A request not answered within ``timeout_s`` is cancelled and recorded as ``timeout``.
- Latency is answer time minus *intended* send time. In closed loop they are the same instant; in
  open loop the intended time comes from the schedule, so when the server (or this client) stalls,
  every request scheduled during the stall carries the stall in its latency (no coordinated
  omission). ``sent_ns`` records when it really went out, so the client's own lag stays visible.
- Only requests intended at or after the end of warm-up are recorded; in duration mode none is
  sent with an intended time at or after the end of the window, in count mode exactly ``requests``
  are sent after warm-up (split over the processes).
- Processes share nothing but a start time and one progress counter each: process ``p`` of ``P``
  runs its share of the clients (closed) or of the rate (open: every P-th slot of a constant
  schedule, or an independent Poisson stream of rate/P), so the merged stream is the one asked for.
"""

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt

from lumenrt.bench.load_targets import (
    NO_CREDENTIALS,
    Credentials,
    Target,
    error_kind,
    make_target,
    parse_target,
)

NO_VALUE = -1  # a stage time or batch size the server did not report
_START_DELAY_NS = 50_000_000  # from "everyone is connected" to the first send: lets children settle
_CHILD_READY_TIMEOUT_S = 120.0  # guessed: a spawned child imports numpy, lumenrt and connects
_STAGE_KEYS = ("queue_ns", "batch_ns", "compute_ns", "return_ns")


@dataclass
class LoadPlan:
    """What to send and how (the whole run; :func:`share` cuts one process's part)."""

    target: str
    model: str
    inputs: Mapping[str, npt.NDArray[Any]]
    version: str | None = None
    mode: str = "closed"  # closed | open
    concurrency: int = 1
    rate_per_s: float = 0.0
    arrival: str = "constant"  # constant | poisson
    warmup_s: float = 1.0
    duration_s: float | None = 10.0
    requests: int | None = None
    connections: int | None = None  # default: concurrency (closed), 16 (open)
    max_outstanding: int = 100_000  # open loop: beyond this the schedule waits (latency still counts)
    timeout_s: float | None = 30.0
    stages: bool = True
    processes: int = 1
    process: int = 0
    seed: int = 1
    credentials: Credentials = NO_CREDENTIALS  # an API key and TLS (load_targets.py)

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "open"):
            raise ValueError(f"mode must be closed or open, not {self.mode!r}")
        if self.mode == "closed" and self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, not {self.concurrency}")
        if self.mode == "open" and not self.rate_per_s > 0:
            raise ValueError(f"--rate must be above 0, not {self.rate_per_s}")
        if self.arrival not in ("constant", "poisson"):
            raise ValueError(f"--arrival must be constant or poisson, not {self.arrival!r}")
        if (self.duration_s is None) == (self.requests is None):
            raise ValueError("give one of --duration-s and --requests")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"--duration-s must be above 0, not {self.duration_s}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"--requests must be at least 1, not {self.requests}")
        if self.warmup_s < 0:
            raise ValueError(f"--warmup-s must be 0 or more, not {self.warmup_s}")
        if self.processes < 1:
            raise ValueError(f"--processes must be at least 1, not {self.processes}")
        parse_target(self.target)  # raises with the reason


def share(plan: LoadPlan, process: int) -> LoadPlan:
    """Process ``process``'s part of ``plan``."""
    p, n = process, plan.processes
    requests = None if plan.requests is None else plan.requests // n + (p < plan.requests % n)
    concurrency = plan.concurrency // n + (p < plan.concurrency % n)
    return replace(
        plan,
        process=p,
        requests=requests,
        concurrency=max(concurrency, 1),
        connections=None if plan.connections is None else max(plan.connections // n, 1),
    )


@dataclass
class Records:
    """One row per recorded request; times are absolute ``time.monotonic_ns()`` (system-wide)."""

    intended_ns: list[int] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)
    done_ns: list[int] = field(default_factory=list)
    error: list[str] = field(default_factory=list)  # "" when ok
    queue_ns: list[int] = field(default_factory=list)
    batch_ns: list[int] = field(default_factory=list)
    compute_ns: list[int] = field(default_factory=list)
    return_ns: list[int] = field(default_factory=list)
    batch_size: list[int] = field(default_factory=list)
    process: list[int] = field(default_factory=list)
    # not a column: per load process, its CPU time (user + system) over the measured window
    cpu_ns: list[int] = field(default_factory=list)

    def add(
        self, intended: int, sent: int, done: int, error: str, timing: Mapping[str, int], process: int
    ) -> None:
        self.intended_ns.append(intended)
        self.sent_ns.append(sent)
        self.done_ns.append(done)
        self.error.append(error)
        self.queue_ns.append(timing.get("queue_ns", NO_VALUE))
        self.batch_ns.append(timing.get("batch_ns", NO_VALUE))
        self.compute_ns.append(timing.get("compute_ns", NO_VALUE))
        self.return_ns.append(timing.get("return_ns", NO_VALUE))
        self.batch_size.append(timing.get("batch_size", NO_VALUE))
        self.process.append(process)

    def extend(self, other: "Records") -> None:
        for name in self.__dataclass_fields__:
            getattr(self, name).extend(getattr(other, name))

    def __len__(self) -> int:
        return len(self.intended_ns)

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Columns as arrays, sorted by intended send time."""
        order = np.argsort(np.asarray(self.intended_ns, dtype=np.int64), kind="stable")
        out: dict[str, npt.NDArray[Any]] = {}
        for name in self.__dataclass_fields__:
            if name == "cpu_ns":
                continue
            values = getattr(self, name)
            array = np.asarray(values, dtype=object if name == "error" else np.int64)
            out[name] = array[order] if len(values) else array
        return out


@dataclass
class Window:
    """The run's clock: warm-up from ``start_ns``, measured from ``measure_ns`` until ``end_ns``
    (duration mode; None in count mode)."""

    start_ns: int
    measure_ns: int
    end_ns: int | None


def window_for(plan: LoadPlan, start_ns: int) -> Window:
    measure = start_ns + int(plan.warmup_s * 1e9)
    end = None if plan.duration_s is None else measure + int(plan.duration_s * 1e9)
    return Window(start_ns, measure, end)


class _Run:
    """One process's loop over one target."""

    def __init__(self, plan: LoadPlan, target: Target, window: Window, progress: Any) -> None:
        self.plan, self.target, self.window, self.progress = plan, target, window, progress
        self.records = Records()
        self.measured_sent = 0  # requests sent with an intended time in the measured window
        timeout = plan.timeout_s
        self.timeout_s = timeout if timeout is not None and timeout > 0 else None

    def _claim(self, intended_ns: int) -> bool | None:
        """May a request intended at ``intended_ns`` be sent? None: no (the run is over); else
        whether it is measured (counted before it is sent, so count mode sends exactly N)."""
        w = self.window
        measured = intended_ns >= w.measure_ns
        if w.end_ns is not None:
            if intended_ns >= w.end_ns:
                return None
        elif measured and self.measured_sent >= (self.plan.requests or 0):
            return None
        if measured:
            self.measured_sent += 1
        return measured

    async def _one(self, intended_ns: int, connection: int, measured: bool) -> None:
        sent = time.monotonic_ns()
        timing: Mapping[str, int] = {}
        error = ""
        try:
            async with asyncio.timeout(self.timeout_s):
                timing = await self.target.infer(connection)
        except Exception as exc:  # every failure is a record, never an escape
            error = error_kind(exc)
        done = time.monotonic_ns()
        if measured:
            self.records.add(intended_ns, sent, done, error, timing, self.plan.process)
            self.progress[self.plan.process] += 1

    async def closed(self) -> None:
        async def client(k: int) -> None:
            while True:
                now = time.monotonic_ns()
                measured = self._claim(now)
                if measured is None:
                    return
                await self._one(now, k, measured)

        await asyncio.gather(*(client(k) for k in range(self.plan.concurrency)))

    def _schedule_gaps_ns(self) -> "Any":
        """Intended send times (ns after start) of this process's stream, lazily."""
        plan = self.plan
        rate = plan.rate_per_s / plan.processes
        if plan.arrival == "constant":
            gap = 1e9 / rate
            k = 0
            phase = plan.process * 1e9 / plan.rate_per_s
            while True:
                yield int(phase + k * gap)
                k += 1
        rng = np.random.default_rng(plan.seed * 1000 + plan.process)
        t = 0.0
        while True:
            for g in rng.exponential(1e9 / rate, 4096):
                t += g
                yield int(t)

    async def open(self) -> None:
        loop_tasks: set[asyncio.Task[None]] = set()
        slot_free = asyncio.Event()
        connections = self.plan.connections or 16

        def finished(task: "asyncio.Task[None]") -> None:
            loop_tasks.discard(task)
            slot_free.set()

        for k, offset in enumerate(self._schedule_gaps_ns()):
            intended = self.window.start_ns + offset
            measured = self._claim(intended)
            if measured is None:
                break
            wait_ns = intended - time.monotonic_ns()
            if wait_ns > 0:
                await asyncio.sleep(wait_ns / 1e9)
            while len(loop_tasks) >= self.plan.max_outstanding:
                slot_free.clear()
                await slot_free.wait()
            task = asyncio.create_task(self._one(intended, k % connections, measured))
            loop_tasks.add(task)
            task.add_done_callback(finished)
        if loop_tasks:
            await asyncio.gather(*loop_tasks)


async def _run_async(plan: LoadPlan, progress: Any, ready: Any) -> Records:
    url = parse_target(plan.target)
    target = make_target(
        url, plan.model, plan.version, plan.inputs, plan.stages, plan.timeout_s, plan.credentials
    )
    connections = plan.connections or (plan.concurrency if plan.mode == "closed" else 16)
    await target.open(connections)
    try:
        start_ns = await asyncio.get_running_loop().run_in_executor(None, ready)
        window = window_for(plan, start_ns)
        delay_ns = start_ns - time.monotonic_ns()
        if delay_ns > 0:
            await asyncio.sleep(delay_ns / 1e9)
        run = _Run(plan, target, window, progress)
        meter = asyncio.ensure_future(_cpu_at(window.measure_ns))
        try:
            await (run.closed() if plan.mode == "closed" else run.open())
        finally:
            meter.cancel()
        if meter.done() and not meter.cancelled():
            run.records.cpu_ns.append(time.process_time_ns() - meter.result())
        return run.records
    finally:
        await target.close()


async def _cpu_at(at_ns: int) -> int:
    """This process's CPU time once the clock reaches ``at_ns`` (the measured window's start)."""
    wait_ns = at_ns - time.monotonic_ns()
    if wait_ns > 0:
        await asyncio.sleep(wait_ns / 1e9)
    return time.process_time_ns()


def _event_loop(plan: LoadPlan) -> asyncio.AbstractEventLoop:
    if plan.target.startswith("grpcio:"):
        return asyncio.new_event_loop()  # grpc.aio keeps to the standard loop
    import uvloop

    return uvloop.new_event_loop()


def run_in_this_process(plan: LoadPlan, progress: Any, ready: Any) -> Records:
    """Run ``plan`` here. ``ready()`` is called (off the loop) once connected and returns the start
    time in ``monotonic_ns``; ``progress[plan.process]`` counts recorded requests."""
    loop = _event_loop(plan)
    try:
        return loop.run_until_complete(_run_async(plan, progress, ready))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _child(plan: LoadPlan, progress: Any, start_ns: Any, connected: Any, go: Any, conn: Connection) -> None:
    def ready() -> int:
        connected.release()
        go.wait()
        return int(start_ns.value)

    try:
        records = run_in_this_process(plan, progress, ready)
        conn.send(("ok", records))
    except BaseException as exc:  # reported to the parent, which raises it
        with contextlib.suppress(Exception):
            conn.send(("error", f"load process {plan.process}: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def run_load(plan: LoadPlan, progress: Any, started_ns: Any = None) -> tuple[Records, Window]:
    """Run ``plan`` over ``plan.processes`` processes (1: this one) and merge their records.
    ``progress`` is a shared array of ``processes`` counters (``multiprocessing.RawArray('q', P)``);
    ``started_ns.value`` (when given) is set to the start time once every process is connected."""
    if plan.mode == "closed" and plan.processes > plan.concurrency:
        raise ValueError(f"--processes {plan.processes} is more than --concurrency {plan.concurrency}")
    if plan.processes == 1:
        chosen: list[int] = []

        def ready() -> int:
            chosen.append(time.monotonic_ns() + _START_DELAY_NS)
            if started_ns is not None:
                started_ns.value = chosen[0]
            return chosen[0]

        records = run_in_this_process(share(plan, 0), progress, ready)
        return records, window_for(plan, chosen[0])
    return _run_children(plan, progress, started_ns)


def _run_children(plan: LoadPlan, progress: Any, started_ns: Any) -> tuple[Records, Window]:
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold loops and threads
    start_ns = ctx.RawValue("q", 0)
    connected = ctx.Semaphore(0)
    go = ctx.Event()
    children = []
    pipes = []
    try:
        for p in range(plan.processes):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child,
                args=(share(plan, p), progress, start_ns, connected, go, child_end),
                name=f"lumenrt-load-{p}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            children.append(proc)
            pipes.append(parent_end)
        deadline = time.monotonic() + _CHILD_READY_TIMEOUT_S
        for _ in range(plan.processes):
            while not connected.acquire(timeout=0.5):
                if time.monotonic() > deadline or any(not c.is_alive() for c in children):
                    go.set()
                    raise RuntimeError(_first_error(pipes) or "a load process failed to start or connect")
        start_ns.value = time.monotonic_ns() + _START_DELAY_NS
        if started_ns is not None:
            started_ns.value = start_ns.value
        go.set()
        merged = Records()
        errors = []
        for pipe in pipes:
            status, payload = pipe.recv()
            if status == "ok":
                merged.extend(payload)
            else:
                errors.append(payload)
        if errors:
            raise RuntimeError("; ".join(errors))
        return merged, window_for(plan, int(start_ns.value))
    finally:
        for proc in children:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _first_error(pipes: list[Connection]) -> str | None:
    for pipe in pipes:
        with contextlib.suppress(Exception):
            if pipe.poll(0.1):
                status, payload = pipe.recv()
                if status == "error":
                    return str(payload)
    return None
