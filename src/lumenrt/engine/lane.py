"""The inline lane: a small model's request runs on the thread that received it.

For a model whose batch-1 compute is shorter than handing a request to a worker thread and back
(digits_mlp: ~8 us of compute against ~30-60 us of ring push, wake-up, GIL hand-over, completion
ring and event-loop wake-up), the fastest place to run it is where it already is. The lane owns one
extra backend session of the model (one intra-op thread, so it never starts a thread pool) and runs
a request in the caller's thread, synchronously, when the model's queue is empty and the request
is no larger than a few times what the probe ran (invariant 6).

Engine key ``lane`` (an architecture choice like ``queue_type``, measured in the matrix):
  queue    every request goes through the ring to the workers (no lane session is loaded);
  inline   the lane runs every request that finds the queue empty and is small (invariant 6);
  auto     as inline for a model whose batch-1 compute, timed at load as the fastest of
           ``PROBE_RUNS`` runs of the lane session (the fastest, so that a busy machine at load
           does not decide it), is at most ``engine.lane_max_us``; otherwise as queue and the lane
           session is closed again. Only for the compiled backends (``AUTO_BACKENDS``): a Python
           model may block or wait on I/O, which would stall every connection of the event loop,
           and is never timed by running it. Not in process mode either: there the model runs
           in worker processes so that a crash in native code cannot take the server down, and
           the lane would run it in the server. ``inline`` takes any model at the user's word.
The front ends add one rule of their own (ingress/service.py, ``infer_inline``): in one turn of the
event loop, requests run on the lane until their checks and model calls took ``engine.lane_turn_us``
together; the turn's other requests queue.

Invariants
  1. Work-conserving and order-keeping: the lane takes a request only when the model's ring is
     empty (nothing waits for a worker that this request would overtake) and the model is not
     closing; otherwise the caller queues it as before (``run`` returns None).
  2. One request at a time, without a lock: running takes the lane's one token (a one-element
     deque: ``popleft`` and ``append`` are single atomic steps under the GIL, and allocate nothing)
     and puts it back after; a caller that finds no token queues. So the lane's statistics and its
     stage times have one writer at a time, and a thread that blocks in the model (a Python model)
     never blocks another caller.
  3. Exactly one answer: ``run`` returns the outputs or raises an EngineError (InvalidInput for a
     request the model config refuses, RequestTimeout for one whose deadline holds it back (7),
     EngineError naming the model when the session fails); it never leaves a request half-taken.
  4. No allocation of its own per request: the stage times are one object reset per request (read
     before the next ``run``), the statistics plain ints; what remains is the backend's call and
     its output arrays.
  5. Bound outputs (ONNX Runtime, ``OnnxRuntimeSession.bind``): for a front end's request (``run``
     without ``times``) of one row, the inputs are copied into arrays bound to the lane's session
     and the outputs come back in arrays bound to it too, the same every time: like the stage
     times, valid until the lane's next request. The front ends encode the answer (a copy) before
     they serve another; the in-process API (``Engine.infer``, which passes its own ``times``) gets
     arrays of its own. Only where the outputs' shapes follow from the inputs' and the answer is at
     most ``BOUND_MAX_BYTES``, so that every encoder copies it into what it writes and no transport
     holds a view of these arrays past the call: the TCP encoder joins frames under 64 KiB, and
     HTTP's ``to_raw`` copies arrays of up to ``SMALL_COPY_BYTES`` (protocols/raw.py).
  6. Only requests of known small cost: the probe timed the model on its probe inputs (batch 1,
     variable dimensions 1), and that is all the lane knows of its cost. A request runs here only
     when its elements are at most ``SIZE_FACTOR`` times the probe inputs' and its bytes at most
     ``SIZE_FACTOR`` times theirs (at least ``MIN_PROBE_BYTES``: a BYTES element of the probe is
     empty); anything larger is handed to the workers (``run`` returns None), since a request on
     the lane holds the thread that received it (the front ends' event loop: every connection)
     for as long as it computes. Sizes are compared with bounds worked out at ``open``: for a
     model whose inputs have fixed non-batch dimensions and no BYTES, the request's rows against
     ``SIZE_FACTOR`` (one comparison); otherwise its elements, then its bytes, summed over its
     inputs (the bytes of a BYTES input only once its elements are within the bound).
  7. Every request's deadline holds here as in the queue. Its timeout is the one the queue would
     give it (the model's default-level queue policy: default timeout, override, DELAY) and counts
     from when the lane takes it, as the queue's counts from admission. One that cannot finish by
     then, since its deadline has passed or is nearer than the probe's fastest run, is answered
     RequestTimeout and not run (counted ``expired``, as a worker counts a request it takes
     late); one that ran past it is answered RequestTimeout too, as the event loop answers a
     queued request at its deadline while a worker still computes it.
"""

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.backends.base import Backend, BackendSession, Placement
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.histograms import DURATION_BOUNDS_NS
from lumenrt.engine.request import Array, EngineError, RequestTimeout, StageTimes
from lumenrt.engine.validate import InputCheck
from lumenrt.engine.worker import WorkerStats, zeros_for
from lumenrt.protocols.raw import SMALL_COPY_BYTES

AUTO_BACKENDS = ("onnxruntime", "xgboost", "pytorch")  # compute only, GIL released while they run
PROBE_RUNS = 50  # batch-1 runs timed at load for ``auto`` (after the model's warm-up)
PROBE_GIVE_UP = 10  # ... fewer when 3 runs all took over this many times lane_max_us
CLOSE_WAIT_S = 30.0  # close(): how long a request running on the lane may take to finish
BOUND_MAX_BYTES = SMALL_COPY_BYTES  # invariant 5: answers the encoders always copy
# invariant 6: a request runs inline only up to this many times the probe inputs' elements and
# bytes (guessed: a batch-1 compute of at most lane_max_us, 30 us by default, times 16 stays well
# inside a loop turn's lane budget, engine.lane_turn_us, 1 ms by default)
SIZE_FACTOR = 16
MIN_PROBE_BYTES = 4096  # invariant 6: the probe's bytes counted as at least this (its strings are empty)


class InlineLane:
    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        model_path: Path,
        options: Any,
        placements: Sequence[Placement],
        *,
        process_mode: bool,
    ) -> None:
        """``options``: the runtime's RuntimeOptions (``lane``, ``lane_max_us``); ``placements``:
        its workers'."""
        self.config = config
        self.mode: str = options.lane
        self.max_us: int = options.lane_max_us
        # the lane's session runs on one thread, except PyTorch's: torch's thread count is one
        # setting for the whole process, so the lane asks for what the workers were given
        workers = placements[0].intra_op_threads if placements else 1
        self._threads = workers if config.backend == "pytorch" else 1
        self._process_mode = process_mode
        self.stats = WorkerStats()
        self.probe_us = 0.0  # fastest batch-1 compute measured at load (0: not measured)
        self.times = StageTimes()  # the last request's stage times (invariant 4)
        self._backend = backend
        self._model_path = model_path
        self._session: BackendSession | None = None
        self._bound: Any = None  # the session bound to arrays for one row (invariant 5), or None
        self._token: deque[bool] = deque([True])  # invariant 2
        self._check_inputs = InputCheck(config)
        # invariant 6: the size bounds, from the probe inputs' shapes
        probe = zeros_for(config, 1)
        self.max_elements = SIZE_FACTOR * max(sum(a.size for a in probe.values()), 1)
        self.max_bytes = SIZE_FACTOR * max(sum(_nbytes(a) for a in probe.values()), MIN_PROBE_BYTES)
        fixed = all(-1 not in spec.dims and spec.datatype != "BYTES" for spec in config.inputs)
        self._max_rows = SIZE_FACTOR if fixed else 0  # 0: count elements and bytes
        self.oversize = 0  # requests handed to the workers for their size
        # invariant 7: the default level's queue policy, as the queue applies it (runtime._admit)
        db = config.dynamic_batching
        policy = db.policy(db.level_of(0)) if db is not None else None
        self._has_policy = policy is not None and (
            policy.default_timeout_us != 0
            or not policy.allow_timeout_override
            or policy.timeout_action == "DELAY"
        )
        self._policy_timeout_s = (
            policy.default_timeout_us / 1e6 if policy and policy.default_timeout_us else None
        )
        self._override = policy is None or policy.allow_timeout_override
        self._delay = policy is not None and policy.timeout_action == "DELAY"
        self._probe_ns = 0  # probe_us in ns, once measured

    @property
    def active(self) -> bool:
        return self._session is not None

    def open(self) -> None:
        """Load the lane's session, warm it, time it; ``auto`` keeps it only if the model is small."""
        if self.mode == "queue" or self.config.gpu_groups:  # GPU instances: the lane would run it on a CPU
            return
        if self.mode == "auto" and (self.config.backend not in AUTO_BACKENDS or self._process_mode):
            return
        placement = Placement(cores=(), intra_op_threads=self._threads)
        session = self._backend.load(self._model_path, self.config, placement)
        try:
            zeros = zeros_for(self.config, 1)
            for _ in range(max(self.config.warmup, 1)):
                session.run(zeros)
            fastest = 0
            for i in range(PROBE_RUNS):
                t0 = time.perf_counter_ns()
                session.run(zeros)
                took = time.perf_counter_ns() - t0
                fastest = took if i == 0 else min(fastest, took)
                if self.mode == "auto" and i >= 2 and fastest > PROBE_GIVE_UP * self.max_us * 1000:
                    break  # far over the limit: no need for 50 runs of a big model
            self.probe_us = fastest / 1000
            self._probe_ns = fastest
        except BaseException:
            session.close()
            raise
        if self.mode == "auto" and self.probe_us > self.max_us:
            session.close()
            return
        self._bound = self._bind(session)
        self._session = session

    def _bind(self, session: BackendSession) -> Any:
        """The session bound for a one-row request (invariant 5), if its backend can and the
        bound run answers as the plain one does; else None."""
        bind = getattr(session, "bind", None)
        if not callable(bind):
            return None
        zeros = zeros_for(self.config, 1)
        rows = 1 if self.config.max_batch_size > 0 else None
        try:
            bound = bind({name: a.shape for name, a in zeros.items()}, rows)
            if bound is None or sum(a.nbytes for a in bound.outputs.values()) > BOUND_MAX_BYTES:
                return None
            plain = session.run(zeros)
            for name, a in zeros.items():
                bound.inputs[name][...] = a
            got = bound()
        except Exception:  # the plain run serves: binding is only a saving
            return None
        same = set(got) == set(plain) and all(
            got[k].shape == plain[k].shape and got[k].dtype == plain[k].dtype for k in plain
        )
        return bound if same else None

    def close(self) -> None:
        """No request runs on the lane from here on; one running now finishes first (its token
        is taken and never put back), then the session closes. Called from the unloading
        thread, never the lane's own."""
        session, self._session = self._session, None
        if session is None:
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        while True:
            try:
                self._token.popleft()
                break
            except IndexError:  # a request is on the lane: it takes one model call
                if time.monotonic() > deadline:
                    break  # it hangs in the model: close anyway (that request fails)
                time.sleep(0.001)
        self._bound = None  # it refers to the session; read only under the token, now taken
        session.close()

    def run(
        self,
        inputs: Mapping[str, Any],
        queued: int,
        times: StageTimes | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Array] | None:
        """The outputs of running ``inputs`` here and now, or None: queue it (invariants 1, 2, 6).
        RequestTimeout when its deadline (``timeout_s``, as the queue would apply it) leaves no
        time to run it, or passed while it ran (invariant 7). ``times``: where to write the stage
        times (default: the lane's own, see invariant 4)."""
        if self._session is None or queued:
            return None
        try:
            token = self._token.popleft()
        except IndexError:  # another caller is running on the lane, or it closed
            return None
        try:
            session = self._session  # read under the token: close() cannot pull it away now
            if session is None:
                return None
            if times is None:
                return self._run(session, inputs, self.times, self._bound, timeout_s)
            return self._run(session, inputs, times, None, timeout_s)
        finally:
            self._token.append(token)

    def _run(
        self,
        session: BackendSession,
        inputs: Mapping[str, Any],
        times: StageTimes,
        bound: Any,
        timeout_s: float | None,
    ) -> dict[str, Array] | None:
        t0 = time.monotonic_ns()
        arrays, rows = self._check_inputs(inputs)
        if not (rows <= self._max_rows if self._max_rows else self._small(arrays)):
            self.oversize += 1  # invariant 6: the workers take it
            return None
        deadline_ns = self._deadline_ns(t0, timeout_s) if timeout_s is not None or self._has_policy else 0
        t1 = time.monotonic_ns()
        if deadline_ns and t1 + self._probe_ns > deadline_ns:  # invariant 7: not run
            self.stats.expired += 1
            raise RequestTimeout(
                f"model {self.config.name!r}: request timed out: its deadline "
                f"({(deadline_ns - t0) // 1000} us) ends before a run on the inline lane could "
                f"(the fastest takes {self._probe_ns // 1000} us); not run"
            )
        try:
            if bound is not None and _fits(bound.inputs, arrays):
                for name, buffer in bound.inputs.items():
                    buffer[...] = arrays[name]
                outputs: dict[str, Array] = bound()
            else:
                outputs = session.run(arrays)
        except Exception as e:
            self.stats.failures += 1
            error = EngineError(f"model {self.config.name!r} failed: {type(e).__name__}: {e}")
            raise error from e
        t2 = time.monotonic_ns()
        times.received_ns = times.enqueued_ns = times.dequeued_ns = t0
        times.batch_formed_ns = times.compute_start_ns = t1
        times.compute_end_ns = times.completed_ns = t2
        times.batch_size = rows
        stats = self.stats
        stats.requests += 1
        stats.batches += 1
        stats.input_ns += t1 - t0
        stats.infer_ns += t2 - t1
        stats.batch_rows[rows] = stats.batch_rows.get(rows, 0) + 1
        stats.queue_buckets[0] += 1  # never queued: 0 ns
        stats.compute_buckets[bisect_left(DURATION_BOUNDS_NS, t2 - t1)] += 1
        batch = stats.batch_ns.get(rows)
        if batch is None:
            batch = stats.batch_ns[rows] = [0, 0, 0]
        batch[0] += t1 - t0
        batch[1] += t2 - t1
        if deadline_ns and t2 > deadline_ns:  # invariant 7: as the event loop answers a queued one
            raise RequestTimeout(
                f"model {self.config.name!r}: deadline passed after {(t2 - t0) // 1000} us, "
                "while it ran on the inline lane"
            )
        return outputs

    def _small(self, arrays: Mapping[str, Array]) -> bool:
        """Within the lane's size bounds (invariant 6): elements first, then bytes."""
        elements = 0
        for a in arrays.values():
            elements += a.size
        if elements > self.max_elements:
            return False
        total = 0
        for a in arrays.values():
            total += _nbytes(a)
        return total <= self.max_bytes

    def _deadline_ns(self, t0: int, timeout_s: float | None) -> int:
        """The request's deadline as the queue would set it at admission ``t0`` (0: none)."""
        if self._has_policy:  # the queue policy's default timeout, override and DELAY (runtime._admit)
            if timeout_s is None or not self._override:
                timeout_s = self._policy_timeout_s
            if self._delay:  # past its timeout it still runs, once the on-time ones have
                return 0
        if timeout_s is None:
            return 0
        return t0 + int(timeout_s * 1e9)

    def describe(self) -> dict[str, Any]:
        """For statistics: the mode asked, whether the lane runs, the probe and its count, the size
        bounds (invariant 6) and how many requests went to the workers past them."""
        return {
            "mode": self.mode,
            "active": self.active,
            "bound": self._bound is not None,  # one-row requests run on bound arrays (invariant 5)
            "probe_us": round(self.probe_us, 2),
            "max_us": self.max_us,
            "requests": self.stats.requests,
            # invariant 6: larger requests go to the workers; how many did
            "max_elements": self.max_elements,
            "max_bytes": self.max_bytes,
            "oversize": self.oversize,
        }


def _nbytes(a: Array) -> int:
    """An input's bytes; a BYTES element as on the wire: a 4-byte length, then its bytes."""
    if a.dtype != np.object_:
        return int(a.nbytes)
    total = 0
    for v in a.flat:
        total += 4 + (len(v) if isinstance(v, bytes | bytearray | str) else 8)
    return total


def _fits(buffers: dict[str, Array], arrays: Mapping[str, Array]) -> bool:
    """Every input has its bound array's shape and dtype (invariant 5)."""
    for name, buffer in buffers.items():
        a = arrays[name]
        if a.shape != buffer.shape or a.dtype != buffer.dtype:
            return False
    return True
