"""The inference service every front end calls: HTTP, gRPC and the TCP protocol share it.

It owns what is the same whatever the wire: which model and version a request names, checking the
inputs a client sent against the model config (naming the field), running the request on the
engine, choosing the outputs, the per-model success/failure counters that feed Triton-shaped
statistics, the model repository actions, and shutdown (refuse new requests, wait for those in
flight).

Threads: every front end runs on the one event loop of ``lumenrt serve`` (gRPC through grpc.aio),
so the counters here are plain ints touched by that thread only; model load and unload run in a
helper thread, one at a time (``_repo_lock``).
"""

import asyncio
import functools
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lumenrt import __version__
from lumenrt.engine.engine import Engine
from lumenrt.engine.histograms import DURATION_BOUNDS_NS, duration_buckets
from lumenrt.engine.request import Array, InferRequest, StageTimes
from lumenrt.engine.runtime import PLACEMENT_REPORT_MAX_AGE_S
from lumenrt.engine.server_config import DEFAULT_LANE_TURN_US
from lumenrt.ingress.auth import Gate
from lumenrt.ingress.errors import as_server_error, not_found, unavailable
from lumenrt.ingress.loop_spin import LoopSpinner
from lumenrt.ingress.rate_limit import RateLimiter
from lumenrt.ingress.response_cache import CacheInput, CacheKey, CacheStats, ResponseCache
from lumenrt.ingress.shared_memory import SharedMemoryRegistry
from lumenrt.observability.access_log import AccessLog
from lumenrt.protocols.errors import ServerError, bad_request

SERVER_NAME = "lumenrt"
EXTENSIONS = (
    "binary_tensor_data",
    "statistics",
    "model_repository",
    "model_configuration",
    "schedule_policy",
)
# Triton platform names by backend, for model metadata and config (perf_analyzer reads them).
logger = logging.getLogger(__name__)

PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "xgboost": "xgboost",
    "python": "python",
}


# who serves gRPC (``ServeOptions.grpc_server``, ``--grpc-server``): lumenrt's own HTTP/2 server
# (ingress/grpc_h2.py), or grpc.aio (ingress/grpc_server.py)
GRPC_SERVERS = ("h2", "grpcio")


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """Limits that protect the server from a client; every one is checked before allocating."""

    max_body_bytes: int = 64 << 20  # one HTTP body / TCP frame
    max_header_bytes: int = 64 << 10  # HTTP request headers / a frame's JSON header
    max_elements: int = 1 << 26  # elements in one tensor
    receive_timeout_s: float = 30.0  # a started request must arrive whole within this
    idle_timeout_s: float = 300.0  # an idle keep-alive connection is closed after this
    grace_s: float = 10.0  # shutdown: how long in-flight requests may take to finish
    # shutdown: how long new requests are still served after readiness turns false, so that a load
    # balancer polling readiness stops sending before any request is refused (0: refused at once)
    drain_delay_s: float = 0.0
    max_headers: int = 100  # HTTP header fields in one request (431 past it)
    max_chunks: int = 4096  # chunks of one chunked HTTP body (413 past it)
    max_connections_per_client: int = 512  # open connections from one address (0: no limit)


@dataclass(slots=True)
class WireInput:
    """One input tensor as a client sent it, already decoded to an array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: Array


# runtime statistics left out of the "lumenrt" part of Triton-shaped statistics: shown elsewhere
# (batch_stats) or only for the metrics (histogram buckets)
_NOT_IN_LUMENRT_STATS = ("arena", "ring", "batch_rows", "batch_ns", "queue_buckets", "compute_buckets")


@dataclass(slots=True)
class ProtocolCounters:
    """One protocol's answers to one model version (event-loop thread only; the metrics read them)."""

    statuses: dict[int, int] = field(default_factory=dict)  # HTTP-style status -> answers
    # end to end, received -> answer handed to the front end (engine/histograms.py's buckets)
    buckets: list[int] = field(default_factory=duration_buckets)
    sum_ns: int = 0


@dataclass(slots=True)
class _Counters:
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0
    protocols: dict[str, ProtocolCounters] = field(default_factory=dict)  # http, grpc, tcp, inprocess


class PendingAnswer(Protocol):
    """A front end's record of one request submitted with ``InferenceService.submit``."""

    runtime: Any
    outputs: list[str]
    timing: bool
    received_ns: int
    priority: int  # 0: the model's default level
    protocol: str  # the front end's (metrics label): http, grpc, tcp
    engine_request: Any  # set by ``submit``: the engine's record, to cancel it (``cancel``)

    def answer(self, outcome: "InferOutcome") -> None:
        """Encode and write the answer (before returning: the outputs are released after)."""
        ...

    def fail(self, error: ServerError) -> None:
        """Write the error as the answer."""
        ...


class ReceivedBody(Protocol):
    """A request body a front end received straight into an arena slot (``receive_slot``)."""

    def take(self, runtime: Any) -> int:
        """The slot, handed over to ``runtime``'s admission (-1: none for that runtime); the
        front end no longer returns it."""
        ...


@dataclass(slots=True)
class InferOutcome:
    """A finished request as a front end encodes it."""

    model: str
    version: int
    outputs: list[tuple[str, Array]]
    times: StageTimes
    parameters: dict[str, Any] = field(default_factory=dict)


def parse_version(version: str | None, model: str) -> int | None:
    """'' or None: the latest loaded version."""
    if version is None or version == "":
        return None
    if not version.isdigit() or len(version) > 18:
        raise bad_request(f"model {model!r}: version must be a positive integer, got {version!r}")
    return int(version)


def timing_parameters(times: StageTimes) -> dict[str, int]:
    """Server-side stage times of one request (ns), as V2 response parameters / TCP header fields."""

    def span(a: int, b: int) -> int:
        return b - a if a and b >= a else 0

    return {
        "queue_ns": span(times.enqueued_ns, times.dequeued_ns),
        "batch_ns": span(times.dequeued_ns, times.compute_start_ns),
        "compute_ns": span(times.compute_start_ns, times.compute_end_ns),
        "return_ns": span(times.compute_end_ns, times.completed_ns),
        "engine_ns": span(times.received_ns or times.enqueued_ns, times.completed_ns),
        "batch_size": times.batch_size,
    }


def _outcome(
    rt: Any, arrays: Mapping[str, Array], names: list[str], times: StageTimes, timing: bool, start_ns: int
) -> InferOutcome:
    """The answer a front end encodes: the outputs asked for, in order, and the stage times (as
    ``lumenrt_*`` parameters too when the client asked for timing)."""
    times.received_ns = start_ns
    params: dict[str, Any] = {}
    if timing:
        params = {f"lumenrt_{k}": v for k, v in timing_parameters(times).items()}
    return InferOutcome(rt.config.name, rt.version, [(n, arrays[n]) for n in names], times, params)


class InferenceService:
    def __init__(self, engine: Engine, limits: ServeLimits | None = None, cache_size_bytes: int = 0) -> None:
        self.engine = engine
        self.limits = limits or ServeLimits()
        self.accepting = True
        self.draining = False  # shutdown began: readiness false, requests still served (drain_delay_s)
        self.in_flight = 0
        self._drain_cut = False  # set by cut_drain(): wait_idle returns at once
        # The loop the front ends run on, set by ServerApp.start (None: asked of asyncio at each
        # use). Kept because CPython 3.11's asyncio.get_running_loop() makes a getpid() system
        # call every time (its fork check): one per request on the submit path and the lane.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.spinner: LoopSpinner | None = None  # engine.loop_spin_us (loop_spin.py); set with ``loop``
        self._lane_turn = False  # a request ran inline in this turn of the event loop ...
        self._lane_spent_ns = 0  # ... and the inline compute of this turn so far (``_new_turn``)
        settings = getattr(engine, "settings", None)  # (test doubles of the engine have none)
        self._lane_turn_ns = (settings.lane_turn_us if settings else DEFAULT_LANE_TURN_US) * 1000
        self._counters: dict[tuple[str, int], _Counters] = {}
        # observability.metrics.ServiceMetrics (GET /metrics); set by ServerApp, None: --no-metrics
        self.metrics: Any = None
        self._repo_lock = threading.Lock()  # one load/unload at a time
        # the response cache (None: --cache-size-bytes 0); see "response cache" below
        self.cache = ResponseCache(cache_size_bytes) if cache_size_bytes > 0 else None
        # the structured access log (observability/access_log.py; None: off): ``_count`` hands it
        # one record per answer, which it writes from a thread of its own
        self.access_log: AccessLog | None = None
        self._cache_memo: tuple[Mapping[str, Array], list[str], CacheKey] | None = None
        # who may call what (ingress/auth.py; None: every endpoint open) and how often
        # (ingress/rate_limit.py; None: no limits); set by ServerApp
        self.gate: Gate | None = None
        # Triton's system shared-memory extension (ingress/shared_memory.py); None: off (the default)
        self.shared_memory: SharedMemoryRegistry | None = None
        self.limiter: RateLimiter | None = None

    # ---- health and metadata ------------------------------------------------------------------

    def live(self) -> bool:
        return not self.engine.closed

    def ready(self) -> bool:
        return self.accepting and not self.draining and self.engine.ready()

    def model_ready(self, name: str, version: str | None = None) -> bool:
        return self.accepting and not self.draining and self.engine.ready(name, parse_version(version, name))

    def server_metadata(self) -> dict[str, Any]:
        extensions = list(EXTENSIONS)
        if self.shared_memory is not None:
            extensions.append("system_shared_memory")
        return {"name": SERVER_NAME, "version": __version__, "extensions": extensions}

    def runtime(self, name: str, version: str | None = None) -> Any:
        try:
            return self.engine.runtime(name, parse_version(version, name))
        except ServerError:
            raise
        except Exception as exc:
            raise as_server_error(exc) from None

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        rt = self.runtime(name, version)
        meta = self.engine.metadata(name, rt.version)
        meta["platform"] = PLATFORMS.get(rt.config.backend, rt.config.backend)
        return meta

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """A Triton-compatible model configuration (the JSON form of Triton's ModelConfig)."""
        rt = self.runtime(name, version)
        cfg = rt.config
        workers = int(rt.statistics().get("workers", 1))

        def tensors(specs: Iterable[Any]) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "data_type": "TYPE_STRING" if s.datatype == "BYTES" else f"TYPE_{s.datatype}",
                 "dims": list(s.dims) or ([1] if cfg.max_batch_size == 0 else []), "format": "FORMAT_NONE"}
                for s in specs
            ]  # fmt: skip

        out: dict[str, Any] = {
            "name": cfg.name,
            "platform": PLATFORMS.get(cfg.backend, cfg.backend),
            "backend": cfg.backend,
            "version_policy": {cfg.version_policy: {}} if cfg.version_policy != "specific" else {
                "specific": {"versions": list(cfg.versions)}},
            "max_batch_size": cfg.max_batch_size,
            "input": tensors(cfg.inputs),
            "output": tensors(cfg.outputs),
            "instance_group": self._instance_groups(cfg, workers),
            "parameters": self._architecture(rt),
        }  # fmt: skip
        if cfg.response_cache:
            out["response_cache"] = {"enable": True}
        if cfg.dynamic_batching is not None:
            db = cfg.dynamic_batching
            out["dynamic_batching"] = {
                "preferred_batch_size": list(db.preferred_batch_size),
                "max_queue_delay_microseconds": db.max_queue_delay_us,
                "default_queue_policy": {
                    "max_queue_size": db.max_queue_size,
                    "default_timeout_microseconds": db.default_timeout_us,
                },
            }
        return out

    @staticmethod
    def _instance_groups(cfg: Any, workers: int) -> list[dict[str, Any]]:
        """Triton's instance_group list: the CPU instances (as many as run), then each KIND_GPU group."""
        gpu_instances = len(cfg.gpu_devices)
        groups: list[dict[str, Any]] = []
        if cfg.instance_group is not None:
            groups.append(
                {
                    "name": cfg.name,
                    "kind": "KIND_CPU",
                    "count": workers - gpu_instances,
                    "gpus": [],
                    "host_policy": cfg.instance_group.host_policy,
                }
            )
        for i, group in enumerate(cfg.gpu_groups):
            groups.append(
                {
                    "name": f"{cfg.name}_gpu{i}",
                    "kind": "KIND_GPU",
                    "count": group.count,
                    "gpus": list(group.gpus),
                    "host_policy": "",
                }
            )
        return groups  # fmt: skip

    def _architecture(self, rt: Any) -> dict[str, dict[str, str]]:
        """The engine's architecture as Triton-style string parameters (``lumenrt_*``), so that a
        load generator can record which configuration it measured."""
        options = rt.options
        arch = {
            "mode": self.engine.settings.worker_mode,
            "queue_type": options.queue_type,
            "allocator_type": options.allocator_type,
            "spin_us": options.spin_us,
            "loop_spin_us": getattr(self.engine.settings, "loop_spin_us", 0),
            "pin": options.pin,
            "lane": "inline" if rt.lane.active else "queue",  # what auto decided for this model
            # Triton's rule: requests share a batch only with dynamic_batching configured
            "batching": "dynamic"
            if rt.config.dynamic_batching is not None
            else "none (each request runs alone)",
        }
        return {f"lumenrt_{k}": {"string_value": str(v)} for k, v in arch.items()}

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics shape: counts and cumulative ns per stage, per model version."""
        if name:
            runtimes = [self.runtime(name, version)]
        else:
            runtimes = [self.engine.runtime(n) for n in self.engine.models()]
        return {"model_stats": [self._model_stats(rt) for rt in runtimes]}

    def _model_stats(self, rt: Any) -> dict[str, Any]:
        s = rt.statistics()
        c = self._counters.get((rt.config.name, rt.version), _Counters())
        cache = self.cache.peek_stats(rt.config.name, rt.version) if self.cache else CacheStats()
        requests = int(s.get("requests", 0))
        batches = s.get("batch_rows") or {}
        batch_ns = s.get("batch_ns") or {}  # rows -> [input, infer, output] ns over its batches
        # Triton counts inferences in batch rows (a request of 4 rows is 4 inferences)
        rows = sum(r * n for r, n in batches.items()) if batches else requests

        def stat(count: int, ns: int) -> dict[str, int]:
            return {"count": count, "ns": ns}

        return {
            "name": rt.config.name,
            "version": str(rt.version),
            "last_inference": c.last_inference_ms,
            "inference_count": rows,
            "execution_count": int(s.get("batches", 0)),
            "inference_stats": {
                "success": stat(c.success_count, c.success_ns),
                "fail": stat(c.fail_count, c.fail_ns),
                "queue": stat(requests, int(s.get("queue_ns", 0))),
                "compute_input": stat(requests, int(s.get("input_ns", 0))),
                "compute_infer": stat(requests, int(s.get("infer_ns", 0))),
                "compute_output": stat(requests, int(s.get("output_ns", 0))),
                "cache_hit": stat(cache.hits, cache.hit_ns),
                "cache_miss": stat(cache.misses, cache.miss_ns),
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": stat(n, batch_ns.get(rows, (0, 0, 0))[0]),
                    "compute_infer": stat(n, batch_ns.get(rows, (0, 0, 0))[1]),
                    "compute_output": stat(n, batch_ns.get(rows, (0, 0, 0))[2]),
                }
                for rows, n in sorted(batches.items())
            ],
            "lumenrt": {
                **{k: v for k, v in s.items() if k not in _NOT_IN_LUMENRT_STATS},
                # each worker's CPUs, threads, node and memory locality (read at most every 30 s)
                "placement": rt.placement_report(max_age_s=PLACEMENT_REPORT_MAX_AGE_S),
            },
        }

    # ---- model repository ---------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        loaded = set(self.engine.models())
        out: list[dict[str, Any]] = []
        for entry in self.engine.repository.index():
            if entry.name in loaded:
                for v in sorted(self.engine._runtimes.get(entry.name, {})):
                    out.append({"name": entry.name, "version": str(v), "state": "READY", "reason": ""})
            elif not ready_only:
                out.append({"name": entry.name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"})
        return out

    def load(self, name: str) -> None:
        """Load (or reload) a model from the repository; blocking (call it off the event loop)."""
        if not self.accepting:
            raise unavailable("server is shutting down")
        with self._repo_lock:
            try:
                self.engine.load(name)
            except Exception as exc:
                err = as_server_error(exc)
                if err.status == 500:
                    err = bad_request(f"failed to load model {name!r}: {exc}")
                raise err from None
            self.warn_uncached([name])

    def unload(self, name: str) -> None:
        with self._repo_lock:
            if name not in self.engine.models():
                raise not_found(f"model {name!r} is not loaded (loaded: {', '.join(self.engine.models())})")
            self.engine.unload(name)

    # ---- inference ----------------------------------------------------------------------------

    def check_inputs(self, rt: Any, inputs: Iterable[WireInput]) -> dict[str, Array]:
        """The wire inputs as the engine's input mapping; names and datatypes checked against the
        model config (shapes are checked by the engine)."""
        cfg = rt.config
        specs = getattr(rt, "input_specs", None)  # ModelRuntime's, made once
        if specs is None:
            specs = {s.name: s for s in cfg.inputs}
        arrays: dict[str, Array] = {}
        for wi in inputs:
            spec = specs.get(wi.name)
            if spec is None:
                raise bad_request(
                    f"model {cfg.name!r}: unknown input {wi.name!r} (inputs: {', '.join(specs)})"
                )
            if wi.name in arrays:
                raise bad_request(f"model {cfg.name!r}: input {wi.name!r} given twice")
            if wi.datatype != spec.datatype:
                raise bad_request(
                    f"model {cfg.name!r}: input {wi.name!r}: datatype {wi.datatype} but the model takes "
                    f"{spec.datatype}"
                )
            arrays[wi.name] = wi.array
        for name in specs:
            if name not in arrays:
                raise bad_request(f"model {cfg.name!r}: missing input {name!r}")
        return arrays

    def check_outputs(self, rt: Any, requested: list[str] | None) -> list[str]:
        names = [s.name for s in rt.config.outputs]
        if not requested:
            return names
        for name in requested:
            if name not in names:
                raise bad_request(
                    f"model {rt.config.name!r}: unknown output {name!r} (outputs: {', '.join(names)})"
                )
        return requested

    def _admit(self) -> None:
        if not self.accepting:
            raise unavailable("server is shutting down: not accepting new requests")
        self.in_flight += 1

    def _done(
        self,
        rt: Any,
        start_ns: int,
        ok: bool,
        protocol: str = "inprocess",
        status: int = 0,
        request_id: str | int | None = None,
        times: StageTimes | None = None,
    ) -> None:
        self._count(rt, start_ns, ok, protocol, status, request_id, times)
        self.in_flight -= 1

    def _count(
        self,
        rt: Any,
        start_ns: int,
        ok: bool,
        protocol: str = "inprocess",
        status: int = 0,
        request_id: str | int | None = None,
        times: StageTimes | None = None,
    ) -> None:
        """One answer (``status``: its HTTP-style code; 0: 200 if ``ok`` else 500). Plain ints and
        lists, event-loop thread only; nothing allocated per request once a model version and
        protocol have been seen. With the access log on, one record for it (``request_id``: the
        client's, if any; ``times``: the engine's stage times, if it reached the engine)."""
        end = time.monotonic_ns()
        took_ns = end - start_ns
        key = (rt.config.name, rt.version)
        c = self._counters.get(key)
        if c is None:
            c = self._counters[key] = _Counters()
        if ok:
            c.success_count += 1
            c.success_ns += took_ns
        else:
            c.fail_count += 1
            c.fail_ns += took_ns
        c.last_inference_ms = time.time_ns() // 1_000_000
        p = c.protocols.get(protocol)
        if p is None:
            p = c.protocols[protocol] = ProtocolCounters()
        code = status or (200 if ok else 500)
        p.statuses[code] = p.statuses.get(code, 0) + 1
        p.buckets[bisect_left(DURATION_BOUNDS_NS, took_ns)] += 1
        p.sum_ns += took_ns
        log = self.access_log
        if log is not None:
            log.record(key[0], key[1], protocol, code, request_id, start_ns, end, times)

    def request_counters(self) -> dict[tuple[str, int], _Counters]:
        """(model, version) -> its answer counters, for the metrics (read, never written)."""
        return dict(self._counters)

    async def infer(
        self,
        rt: Any,
        arrays: Mapping[str, Array],
        outputs: list[str],
        *,
        timeout_s: float | None = None,
        timing: bool = False,
        received_ns: int = 0,
        priority: int = 0,
        protocol: str = "inprocess",
        request_id: str | None = None,
    ) -> InferOutcome:
        """Run one request on the event loop's engine path; raises ServerError. Cancelling the
        awaiting task (a gRPC client that cancels or goes) drops the request before it runs.
        ``protocol``: the front end's, for the metrics; ``request_id``: the client's, for the
        access log."""
        key, cached = self._cache_find(rt, arrays, outputs)
        if cached is not None:
            return self._cache_hit(rt, cached, timing, received_ns, protocol, request_id)
        self._admit()
        start = received_ns or time.monotonic_ns()
        ok = False
        status = 499  # what ends it without an answer: the awaiting task cancelled (its client went)
        times: StageTimes | None = None
        try:
            result = await self.engine.infer_async(
                rt.config.name, arrays, version=rt.version, timeout_s=timeout_s, priority=priority
            )
            times = result.times
            outcome = _outcome(rt, result.outputs, outputs, result.times, timing, start)
            self._cache_store(key, outcome)
            ok, status = True, 200
            return outcome
        except Exception as exc:
            error = as_server_error(exc)
            status = error.status
            raise error from None
        finally:
            self._done(rt, start, ok, protocol, status, request_id, times)

    def submit(
        self,
        pending: "PendingAnswer",
        arrays: Mapping[str, Array],
        timeout_s: float | None,
        received: "ReceivedBody | None" = None,
    ) -> None:
        """Queue one request from the event loop without a Task or Future: the engine calls back
        on this thread once it is answered, and ``pending.answer(outcome)`` or
        ``pending.fail(error)`` runs exactly once, then the request's record is released.
        ``pending`` is the front end's own record of the request (runtime, outputs, timing,
        received_ns). Raises ServerError when it is refused at once (then no call back).
        ``received``: the arena slot ``arrays`` were received in; the engine takes it over once
        the request reaches it (else it stays the caller's to return)."""
        key, cached = self._cache_find(pending.runtime, arrays, pending.outputs)
        if cached is not None:  # answered now, inside submit (the front ends expect that)
            pending.answer(
                self._cache_hit(
                    pending.runtime,
                    cached,
                    pending.timing,
                    pending.received_ns,
                    pending.protocol,
                    getattr(pending, "request_id", None),
                )
            )
            return
        on_answer = self._answered if key is None else functools.partial(self._answered_to_cache, key)
        self._admit()
        try:
            pending.engine_request = self.engine.submit_callback(
                pending.runtime,
                arrays,
                on_answer,
                pending,
                timeout_s=timeout_s,
                priority=pending.priority,
                received_slot=received.take(pending.runtime) if received is not None else -1,
                loop=self.loop,
            )
        except Exception as exc:
            error = as_server_error(exc)
            received_ns = pending.received_ns or time.monotonic_ns()
            request_id = getattr(pending, "request_id", None)
            self._done(pending.runtime, received_ns, False, pending.protocol, error.status, request_id)
            raise error from None

    def cancel(self, pending: "PendingAnswer") -> None:
        """The client of a request given to ``submit`` went away: the engine drops it before it
        runs (counted as cancelled); one already running finishes. Its answer still comes back
        (``pending.answer`` or ``fail``), for the front end to discard."""
        req = pending.engine_request
        if req is not None and req.context is pending:  # not answered and released yet
            pending.runtime.cancel(req)

    def admit_client(self, client: str, rt: Any, protocol: str, received_ns: int = 0) -> None:
        """``client``'s rate limits (its key's name, or its address): raises 429, counted as the
        model's answer, when it is over one. Call only when ``limiter`` is set."""
        assert self.limiter is not None
        try:
            self.limiter.admit(client, rt.config.name)
        except ServerError as err:
            self._done(rt, received_ns or time.monotonic_ns(), False, protocol, err.status)
            raise

    def check_priority(self, rt: Any, priority: int, where: str) -> None:
        """A request's priority against its model's levels (400 naming ``where``)."""
        if not priority:
            return
        levels = rt.levels
        if not 0 < priority <= levels:
            raise bad_request(
                f"{where}: model {rt.config.name!r} has priority levels 1..{levels} "
                f"(0: its default level), got {priority}"
            )

    def _answered(self, req: InferRequest) -> None:
        """The engine's call back for ``submit`` (event loop thread): one answer, then release.
        The front end's ``answer`` encodes before it returns, so the outputs (in the request's
        record, or its arena slot) are released only after."""
        pending: PendingAnswer = req.context
        rt = pending.runtime
        spinner = self.spinner
        if spinner is not None:  # the client's next request comes after this answer
            spinner.seen()
        start = pending.received_ns or req.times.received_ns
        outcome: InferOutcome | None = None
        failure: ServerError | None = None
        try:
            if req.error is not None:
                failure = as_server_error(req.error)
            else:
                assert req.outputs is not None
                outcome = _outcome(rt, req.outputs, pending.outputs, req.times, pending.timing, start)
        except Exception as exc:
            failure = as_server_error(exc)
        self._done(
            rt,
            start,
            failure is None,
            pending.protocol,
            200 if failure is None else failure.status,
            # only the access log reads it (PendingAnswer's request_id is optional)
            getattr(pending, "request_id", None) if self.access_log is not None else None,
            req.times,
        )
        try:
            if outcome is not None:
                pending.answer(outcome)
            else:
                assert failure is not None
                pending.fail(failure)
        finally:
            rt.release(req)

    def infer_inline(
        self,
        rt: Any,
        arrays: Mapping[str, Array],
        outputs: list[str],
        *,
        timeout_s: float | None = None,
        timing: bool = False,
        received_ns: int = 0,
        protocol: str = "inprocess",
        request_id: str | int | None = None,
        priority: int = 0,
    ) -> InferOutcome | None:
        """Run one request on the model's inline lane, now, in this thread (engine/lane.py); None
        when the lane does not take it (no lane, queue not empty, its time already up, shutting
        down, this loop turn's inline time used up, a priority level not the model's default):
        the caller then awaits ``infer``. Raises
        ServerError. The outcome's stage times are the lane's, valid until its next request:
        encode the answer before serving another."""
        spinner = self.spinner
        if spinner is not None:
            spinner.seen()
        key, cached = self._cache_find(rt, arrays, outputs)
        if cached is not None:
            return self._cache_hit(rt, cached, timing, received_ns, protocol, request_id)
        if key is not None:  # a miss: ``submit`` or ``infer`` takes this key on (no second lookup)
            self._cache_memo = (arrays, outputs, key)
        if not rt.lane.active or not self.accepting:
            return None
        if not self._lane_turn:  # the turn's first: it always may (see ``_new_turn``)
            self._lane_turn, self._lane_spent_ns = True, 0
            (self.loop or asyncio.get_running_loop()).call_soon(self._new_turn)
        elif self._lane_spent_ns >= self._lane_turn_ns:
            return None
        start = received_ns or time.monotonic_ns()
        try:
            result = rt.run_inline(arrays, None, timeout_s, priority)
        except Exception as exc:
            self._lane_spent_ns += time.monotonic_ns() - start  # a failed run used the turn too
            error = as_server_error(exc)
            self._count(rt, start, False, protocol, error.status, request_id)
            raise error from None
        if result is None:
            return None
        times = rt.lane.times
        self._lane_spent_ns += times.compute_end_ns - times.received_ns
        self._count(rt, start, True, protocol, 0, request_id, times)
        outcome = _outcome(rt, result, outputs, times, timing, start)
        self._cache_store(key, outcome)
        return outcome

    def _new_turn(self) -> None:
        """The event loop finished the I/O callbacks of one turn. Requests run inline in a turn
        until their checks and model calls took ``engine.lane_turn_us`` together (the first always
        runs); the others that arrived in the same turn (other connections, or pipelined frames)
        are handed to the workers: while the loop computes, it is not reading, parsing or writing
        for the rest, and under load the workers' core takes the excess in parallel. Below that
        budget a request runs where it is, since for a lane model handing it over costs the loop
        more (a ring push, then the completion back) than computing it. 0: one request a turn. At
        one client every request has a turn of its own, so every request runs inline."""
        self._lane_turn = False

    # ---- response cache (ingress/response_cache.py) ---------------------------------------------
    # Only for models whose config enables it, and only with a server budget (``self.cache``).
    # Every front end calls ``infer_inline`` first: a hit is answered there; on a miss it leaves
    # the key in ``_cache_memo`` for the ``submit`` or ``infer`` that follows with the same arrays
    # (same objects), so a request is looked up and counted once. A caller that goes straight to
    # ``submit``/``infer`` gets its lookup there.

    def _cache_find(
        self, rt: Any, arrays: Mapping[str, Array], outputs: list[str]
    ) -> tuple[CacheKey | None, tuple[tuple[str, Array], ...] | None]:
        """(key, cached outputs): (None, None) when the cache does not apply; (key, None) a miss."""
        cache = self.cache
        if cache is None or not self.accepting or not rt.config.response_cache:
            return None, None
        memo, self._cache_memo = self._cache_memo, None
        if memo is not None and memo[0] is arrays and memo[1] is outputs:
            return memo[2], None
        started = time.monotonic_ns()
        inputs = [CacheInput(s.name, s.datatype, arrays[s.name]) for s in rt.config.inputs]
        key = cache.key(rt.config.name, rt.version, rt.model_id, inputs, outputs)
        return key, cache.lookup(key, started)

    def _cache_hit(
        self,
        rt: Any,
        cached: tuple[tuple[str, Array], ...],
        timing: bool,
        received_ns: int,
        protocol: str = "inprocess",
        request_id: str | int | None = None,
    ) -> InferOutcome:
        """The answer of a hit: the outputs as a miss gives them (the requested ones, in order)."""
        start = received_ns or time.monotonic_ns()
        self._count(rt, start, True, protocol, 0, request_id)
        times = StageTimes(completed_ns=time.monotonic_ns())
        return _outcome(rt, dict(cached), [name for name, _ in cached], times, timing, start)

    def _cache_store(self, key: CacheKey | None, outcome: InferOutcome) -> None:
        if key is not None and self.cache is not None:
            self.cache.store(key, outcome.outputs)

    def _answered_to_cache(self, key: CacheKey, req: InferRequest) -> None:
        """``_answered`` for a request to a caching model: keep its outputs (before ``_answered``
        releases them), then answer as usual."""
        if req.error is None and req.outputs is not None and self.cache is not None:
            try:
                names = req.context.outputs
                self.cache.store(key, [(name, req.outputs[name]) for name in names])
            except Exception:  # never lose the answer for the cache's sake (_answered reports it)
                logger.exception("response cache: storing an answer failed")
        self._answered(req)

    def warn_uncached(self, models: Iterable[str]) -> None:
        """One warning naming the models that enable the response cache while the server has no
        cache budget (``--cache-size-bytes 0``); call it when models are loaded."""
        if self.cache is not None:
            return
        enabled = sorted({name for name in models for rt in self._versions(name) if rt.config.response_cache})
        if enabled:
            logger.warning(
                "model(s) %s enable response_cache, but the server's cache budget is 0 "
                "(--cache-size-bytes): their answers are not cached",
                ", ".join(enabled),
            )

    def _versions(self, name: str) -> list[Any]:
        return list(self.engine._runtimes.get(name, {}).values())

    # ---- shutdown -----------------------------------------------------------------------------

    async def announce_drain(self, delay_s: float) -> None:
        """Readiness false, requests still served for ``delay_s`` (or until ``cut_drain``): the
        time a load balancer polling readiness needs to stop sending here."""
        self.draining = True
        deadline = time.monotonic() + delay_s
        while not self._drain_cut and time.monotonic() < deadline:
            await asyncio.sleep(min(0.01, max(deadline - time.monotonic(), 0)))

    def stop_accepting(self) -> None:
        """Readiness false; new requests are refused from now on."""
        self.draining = True
        self.accepting = False

    def cut_drain(self) -> None:
        """Stop waiting: the drain delay ends and in-flight requests are not waited for (their
        answers are dropped with the connections)."""
        self._drain_cut = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0:
            if self._drain_cut or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True
