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
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lumenrt import __version__
from lumenrt.engine.engine import Engine
from lumenrt.engine.request import Array, InferRequest, StageTimes
from lumenrt.ingress.errors import as_server_error, not_found, unavailable
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
PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "xgboost": "xgboost",
    "python": "python",
}


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """Limits that protect the server from a client; every one is checked before allocating."""

    max_body_bytes: int = 64 << 20  # one HTTP body / TCP frame
    max_header_bytes: int = 64 << 10  # HTTP request headers / a frame's JSON header
    max_elements: int = 1 << 26  # elements in one tensor
    receive_timeout_s: float = 30.0  # a started request must arrive whole within this
    idle_timeout_s: float = 300.0  # an idle keep-alive connection is closed after this
    grace_s: float = 10.0  # shutdown: how long in-flight requests may take to finish


@dataclass(slots=True)
class WireInput:
    """One input tensor as a client sent it, already decoded to an array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: Array


@dataclass(slots=True)
class _Counters:
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0


class PendingAnswer(Protocol):
    """A front end's record of one request submitted with ``InferenceService.submit``."""

    runtime: Any
    outputs: list[str]
    timing: bool
    received_ns: int

    def answer(self, outcome: "InferOutcome") -> None:
        """Encode and write the answer (before returning: the outputs are released after)."""
        ...

    def fail(self, error: ServerError) -> None:
        """Write the error as the answer."""
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
    def __init__(self, engine: Engine, limits: ServeLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or ServeLimits()
        self.accepting = True
        self.in_flight = 0
        self._drain_cut = False  # set by cut_drain(): wait_idle returns at once
        self._lane_turn = False  # a request ran inline in this turn of the event loop
        self._counters: dict[tuple[str, int], _Counters] = {}
        self._repo_lock = threading.Lock()  # one load/unload at a time

    # ---- health and metadata ------------------------------------------------------------------

    def live(self) -> bool:
        return not self.engine.closed

    def ready(self) -> bool:
        return self.accepting and self.engine.ready()

    def model_ready(self, name: str, version: str | None = None) -> bool:
        return self.accepting and self.engine.ready(name, parse_version(version, name))

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

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
            "instance_group": [
                {"name": cfg.name, "kind": "KIND_CPU", "count": workers, "gpus": [],
                 "host_policy": ""}
            ],
            "parameters": self._architecture(rt),
        }  # fmt: skip
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

    def _architecture(self, rt: Any) -> dict[str, dict[str, str]]:
        """The engine's architecture as Triton-style string parameters (``lumenrt_*``), so that a
        load generator can record which configuration it measured."""
        options = rt.options
        arch = {
            "mode": self.engine.settings.worker_mode,
            "queue_type": options.queue_type,
            "allocator_type": options.allocator_type,
            "spin_us": options.spin_us,
            "pin": options.pin,
            "lane": "inline" if rt.lane.active else "queue",  # what auto decided for this model
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
        requests = int(s.get("requests", 0))
        batches = s.get("batch_rows") or {}
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
                "cache_hit": stat(0, 0),
                "cache_miss": stat(0, 0),
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": stat(n, 0),
                    "compute_infer": stat(n, 0),
                    "compute_output": stat(n, 0),
                }
                for rows, n in sorted(batches.items())
            ],
            "lumenrt": {k: v for k, v in s.items() if k not in ("arena", "ring", "batch_rows")},
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

    def _done(self, rt: Any, start_ns: int, ok: bool) -> None:
        self._count(rt, start_ns, ok)
        self.in_flight -= 1

    def _count(self, rt: Any, start_ns: int, ok: bool) -> None:
        end = time.monotonic_ns()
        key = (rt.config.name, rt.version)
        c = self._counters.get(key)
        if c is None:
            c = self._counters[key] = _Counters()
        if ok:
            c.success_count += 1
            c.success_ns += end - start_ns
        else:
            c.fail_count += 1
            c.fail_ns += end - start_ns
        c.last_inference_ms = time.time_ns() // 1_000_000

    async def infer(
        self,
        rt: Any,
        arrays: Mapping[str, Array],
        outputs: list[str],
        *,
        timeout_s: float | None = None,
        timing: bool = False,
        received_ns: int = 0,
    ) -> InferOutcome:
        """Run one request on the event loop's engine path; raises ServerError."""
        self._admit()
        start = received_ns or time.monotonic_ns()
        ok = False
        try:
            result = await self.engine.infer_async(
                rt.config.name, arrays, version=rt.version, timeout_s=timeout_s
            )
            outcome = _outcome(rt, result.outputs, outputs, result.times, timing, start)
            ok = True
            return outcome
        except Exception as exc:
            raise as_server_error(exc) from None
        finally:
            self._done(rt, start, ok)

    def submit(self, pending: "PendingAnswer", arrays: Mapping[str, Array], timeout_s: float | None) -> None:
        """Queue one request from the event loop without a Task or Future: the engine calls back
        on this thread once it is answered, and ``pending.answer(outcome)`` or
        ``pending.fail(error)`` runs exactly once, then the request's record is released.
        ``pending`` is the front end's own record of the request (runtime, outputs, timing,
        received_ns). Raises ServerError when it is refused at once (then no call back)."""
        self._admit()
        try:
            self.engine.submit_callback(pending.runtime, arrays, self._answered, pending, timeout_s=timeout_s)
        except Exception as exc:
            self._done(pending.runtime, pending.received_ns or time.monotonic_ns(), False)
            raise as_server_error(exc) from None

    def _answered(self, req: InferRequest) -> None:
        """The engine's call back for ``submit`` (event loop thread): one answer, then release.
        The front end's ``answer`` encodes before it returns, so the outputs (in the request's
        record, or its arena slot) are released only after."""
        pending: PendingAnswer = req.context
        rt = pending.runtime
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
        self._done(rt, start, failure is None)
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
    ) -> InferOutcome | None:
        """Run one request on the model's inline lane, now, in this thread (engine/lane.py); None
        when the lane does not take it (no lane, queue not empty, its time already up, shutting
        down, another request took this loop turn): the caller then awaits ``infer``. Raises
        ServerError. The outcome's stage times are the lane's, valid until its next request:
        encode the answer before serving another."""
        if not rt.lane.active or not self.accepting or self._lane_turn:
            return None
        self._lane_turn = True  # work-conserving: see ``_new_turn``
        asyncio.get_running_loop().call_soon(self._new_turn)
        start = received_ns or time.monotonic_ns()
        try:
            result = rt.run_inline(arrays, None, timeout_s)
        except Exception as exc:
            self._count(rt, start, False)
            raise as_server_error(exc) from None
        if result is None:
            return None
        self._count(rt, start, True)
        return _outcome(rt, result, outputs, rt.lane.times, timing, start)

    def _new_turn(self) -> None:
        """The event loop finished the I/O callbacks of one turn. One request per turn runs inline;
        the others that arrived in the same turn (other connections, or pipelined frames) are
        handed to the workers: while the loop computes one, it is not reading, parsing or writing
        for the rest, and under load the workers' core does that compute in parallel. At one client
        every request has a turn of its own, so every request runs inline."""
        self._lane_turn = False

    # ---- shutdown -----------------------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Readiness false; new requests are refused from now on."""
        self.accepting = False

    def cut_drain(self) -> None:
        """Stop waiting for in-flight requests (their answers are dropped with the connections)."""
        self._drain_cut = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0:
            if self._drain_cut or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True
