"""One loaded model version: admission, its request table, arena and request ring, its inline lane,
and one of two worker pools. Everything here is the same in both worker modes; the pools differ
only in how their workers start, die and report (thread_pool.py, process_pool.py).

Memory: one region per model version holds the request ring, the request records' latches, the
arena (one slot per request in flight) and whatever the pool adds (process pool: its completion
ring, holds, cancel flags and status table). The region is anonymous private memory for the
thread pool and an unnamed memfd for the process pool (handed to workers at spawn; nothing in
/dev/shm, so nothing to unlink after any exit).

Ingress path of a request (``submit`` / ``run``), all in the caller's thread:
  validate -> check the queue bound (max_queue_size) -> take a request record -> copy the inputs
  once (none when a front end received them into a lent slot: ``receive_slot``) into an arena
  slot, in the slot layout of slot_layout.py (a GPU model's request larger than a slot: into a
  large slot of max_batch_size rows; thread pool with allocator_type "standard", or a request no
  slot can hold: into fresh numpy arrays) -> push the request descriptor (descriptors.py) -> a
  worker answers it (execute.py).

Invariants (both pools; each pool adds its own)
  1. Every request admission accepts gets exactly one answer: its outputs, or an EngineError saying
     why (the model failed, its worker died, it expired or was cancelled before running, or the
     model was unloaded first). Nothing that takes a request may end without answering it.
  2. Admission never waits: a request over a limit is refused at once with QueueFull naming the
     limit (max_queue_size; request records; arena slots where the pool needs one), and a push the
     ring refuses (full, closed, or a producer the ring cannot take) is answered at once, its
     record and slot returned, never treated as in flight.
  3. At most max_queue_size requests wait in the ring (exact with one producer thread, as behind
     the server's event loop; concurrent producer threads may overshoot by one each, bounded by
     the ring's capacity).
  4. A request's arena slot is freed once, when its record is released (after its caller has read
     the answer), or at once when admission refuses it.
  5. A synchronous caller with a deadline is answered by then (``run``): if no worker has
     answered SYNC_DEADLINE_SLACK_S past it (one stuck in the model), it gets RequestTimeout and
     its request is cancelled and parked (``_late``) with its record and slot, released once the
     worker sets its latch (by the next admission or lent slot, or close; a worker stuck past
     close's wait keeps its parked requests, as it keeps the region).
  6. A slot lent to a front end to receive a body into (``receive_slot``) is freed once: by
     ``return_slot``, or by admission (``submit(received_slot=)``), which either makes it the
     request's slot (the inputs lie in it as received: not copied) or frees it. At most a quarter
     of the arena is lent at once, and of the large arena.

Shutdown order
  1. closed = True (admission refuses), the pool's ``stop``: no worker is replaced any more;
  2. the request ring closes; the pool drains and ends its workers (``close``), failing what they
     cannot answer;
  3. the lane waits for the request it is running and closes its session; the memory lent to
     front ends still receiving is released (they answer 503), so the region can unmap;
  4. the pool's ``release_memory``: the process pool unmaps the region (the arena with it: a
     release after that frees nothing); the thread pool's private region goes with its last
     reference.
"""

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.backends.base import Backend, Placement
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.descriptors import (
    ASYNC,
    SYNC,
    push_request_wait,
    request_generation,
    ring_capacity,
    try_push_request,
)
from lumenrt.engine.lane import InlineLane
from lumenrt.engine.process_pool import ProcessPool
from lumenrt.engine.request import (
    Array,
    EngineError,
    InferRequest,
    InvalidInput,
    ModelNotReady,
    QueueFull,
    RequestTable,
    RequestTimeout,
    StageTimes,
)
from lumenrt.engine.slot_layout import (
    DATA_AT,
    SlotTooSmall,
    adopt_inputs,
    payload_bytes,
    received_payload,
    slot_bytes_needed,
    write_inputs,
)
from lumenrt.engine.thread_pool import ThreadPool
from lumenrt.engine.validate import InputCheck
from lumenrt.engine.worker import WorkerStats
from lumenrt.native import (
    MAX_AGENTS,
    Latches,
    Layout,
    LrtError,
    Ring,
    RingClosed,
    SlabPool,
    agent_table,
    latches_required_bytes,
    ring_required_bytes,
    slab_required_bytes,
)
from lumenrt.placement.memory import LocalityError, bind_memory, locality, read_numa_maps, thread_policy

ARENA_BUDGET_BYTES = 256 << 20  # per model, process pool; guessed: bounds shared memory for big-input models
ABANDON_WAIT_S = 30.0  # guessed: far longer than any request runs here; past it the record is lost
# A synchronous caller with a deadline waits this long past it for the worker's own answer (the
# worker expires a request it takes late) before answering itself (guessed: scheduling noise)
SYNC_DEADLINE_SLACK_S = 0.002


# Agent tables of a model's request rings (level rings and doorbell; native/include/lrt/ring.h):
# every thread that pushes to or pops from a ring holds an entry while it lives. Those threads are
# the model's workers (a thread each, or a worker process's one thread) and the threads that submit
# requests: the server's event loop, the thread closing the runtime, the process pool's supervisor,
# and, in process, every thread that calls Engine.infer. A table holds every worker plus
# CALLER_AGENTS more (rounded up to whole 64-entry words), so callers alive at once are bounded by
# that, not by the workers; an exited thread's entry is reused once the table is full (agents.c),
# so callers over time are not bounded at all. A caller past the table is refused at once
# ("too many threads use this ring": runtime invariant 2). The entries cost 64 bytes each and
# nothing on the hot path beyond the threads really using the ring. A model needs at least
# MIN_CALLER_AGENTS entries besides its workers, else it is refused at load (ring_agents).
CALLER_AGENTS = 256  # guessed: a generous thread pool of in-process callers
MIN_CALLER_AGENTS = 16  # event loop, closing thread, supervisor, and a few callers


def ring_agents(model: str, n_workers: int) -> int:
    """The agent table (``max_agents``) of the request rings of ``model`` with ``n_workers``
    workers: ValueError naming the model and the count where even MIN_CALLER_AGENTS do not fit."""
    if n_workers + MIN_CALLER_AGENTS > MAX_AGENTS:
        raise ValueError(
            f"model {model!r}: {n_workers} workers exceed the ring's agent table (max {MAX_AGENTS} "
            f"threads, {MIN_CALLER_AGENTS} of them kept for the threads that submit requests: at most "
            f"{MAX_AGENTS - MIN_CALLER_AGENTS} workers a model)"
        )
    return agent_table(min(n_workers + CALLER_AGENTS, MAX_AGENTS))


# A scrape or a statistics request reads numa_maps (page-table walks) at most this often per model,
# on the event loop (placement_report): guessed, a few ms per read on the 2-CPU VM, against
# Prometheus's usual 15 s interval.
PLACEMENT_REPORT_MAX_AGE_S = 30.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    queue_type: str = "mpmc"
    allocator_type: str = "lumen_arena"  # or "standard" (thread pool only)
    pin: bool = True
    arena_slot_bytes: int = 1 << 20
    arena_slots: int = 256
    # A GPU model whose max_batch_size rows outgrow an arena slot gets up to this much more, in
    # slots that hold a whole batch (the large arena), so a big request is copied once into memory
    # that is reused (page-locked with direct copies) rather than into fresh arrays: a fresh 38.5 MB
    # array (SqueezeNet, 64 images) costs a page fault per 4 KiB page on every request. 0: none.
    large_arena_bytes: int = 1 << 30
    spin_us: int = 0  # poll before sleeping: idle workers on the ring, synchronous callers on their latch
    lane: str = "queue"  # the inline lane (engine/lane.py): queue, inline or auto
    lane_max_us: int = 30  # auto: the largest batch-1 compute that runs inline
    batching: str = "adaptive"  # or "fixed": batches exactly as the config says (batch_cost.py)
    worker_mode: str = "thread"  # or "process": which pool runs the workers


@dataclass(frozen=True, slots=True)
class ArenaPlan:
    """How a model's arena is sized, and what happens to a request it cannot hold."""

    slot_bytes: int
    n_slots: int
    required: bool  # True: no slot, no admission (process pool); False: fresh arrays instead
    large_slot_bytes: int = 0  # GPU models in the thread pool: slots of max_batch_size rows
    large_slots: int = 0


def arena_plan(config: ModelConfig, options: RuntimeOptions, table_size: int) -> ArenaPlan | None:
    if options.worker_mode == "process":  # the workers read requests from shared memory only
        max_rows = max(config.max_batch_size, 1)
        slot_bytes = max(slot_bytes_needed(config, max_rows) or options.arena_slot_bytes, 4096)
        n = max(1, min(table_size, options.arena_slots, ARENA_BUDGET_BYTES // slot_bytes))
        return ArenaPlan(slot_bytes, n, required=True)
    if options.allocator_type == "lumen_arena":
        large_bytes, large_n = 0, 0
        if config.gpu_groups:  # a whole batch in one request: a large slot (large_arena_bytes)
            needed = slot_bytes_needed(config, max(config.max_batch_size, 1)) or 0
            if needed > options.arena_slot_bytes:
                large_bytes = (needed + 4095) & ~4095
                large_n = min(table_size, options.large_arena_bytes // large_bytes)
                if large_n < 2:  # a batch too big for the budget: fresh arrays, as before
                    large_bytes, large_n = 0, 0
        return ArenaPlan(
            options.arena_slot_bytes, min(options.arena_slots, table_size), False, large_bytes, large_n
        )
    return None


class ModelRuntime:
    def __init__(
        self,
        *,
        config: ModelConfig,
        version: int,
        model_path: Path,
        backend: Backend,
        placements: list[Placement],
        options: RuntimeOptions,
    ) -> None:
        self.config, self.version, self.options = config, version, options
        self._check_inputs = InputCheck(config)  # validate_inputs, worked out once for the config
        self.input_specs = {spec.name: spec for spec in config.inputs}  # the front ends' name check
        self.model_id = 0  # set by the engine: index used by async completions
        db = config.dynamic_batching
        self.levels = db.levels if db is not None else 1
        # some level's timeout_action is DELAY: its workers put overdue requests back once
        self.delays = db is not None and any(
            db.policy(lv).timeout_action == "DELAY" for lv in range(1, self.levels + 1)
        )
        if config.gpu_groups and options.worker_mode == "process":
            raise ValueError(
                f"model {config.name!r}: KIND_GPU instances need the thread pool (--mode thread): a "
                "worker process would hold a CUDA context of its own (hundreds of MB of device memory "
                "each) and its inputs would cross shared memory before the pinned staging buffers"
            )
        if self.levels > 1 and options.worker_mode == "process":
            raise ValueError(
                f"model {config.name!r}: dynamic_batching.priority_levels > 1 needs the thread pool "
                "(--mode thread): worker processes take requests from one ring"
            )
        # per priority level: its queue policy and bound (the default policy's without levels)
        self._policies = [db.policy(lv) for lv in range(1, self.levels + 1)] if db is not None else []
        self._level_max = [
            db.policy(lv).max_queue_size if db is not None else 1024 for lv in range(1, self.levels + 1)
        ]
        self._max_queue = sum(self._level_max)
        per_batch = max(config.max_batch_size, 1)
        # records: every queued request plus what the workers may hold (a batch each, and a carry;
        # a GPU instance: two batches in flight, engine/gpu/serving.py, and a carry)
        table_size = self._max_queue + sum((3 if p.gpu >= 0 else 2) * per_batch for p in placements)
        self._arena_plan = arena_plan(config, options, table_size)
        pool_class = ProcessPool if options.worker_mode == "process" else ThreadPool
        agents = self.ring_agents = ring_agents(config.name, len(placements))  # refused here if too many
        lay = Layout()
        ring_cap = ring_capacity(self._level_max[0])
        lay.add(ring_required_bytes(ring_cap, agents), name="requests")
        for lv in range(2, self.levels + 1):
            lay.add(
                ring_required_bytes(ring_capacity(self._level_max[lv - 1]), agents), name=f"requests_{lv}"
            )
        # one token per request in any level ring: as many as the level rings can hold
        self._doorbell_cap = ring_capacity(sum(ring_capacity(m) for m in self._level_max))
        if self.levels > 1:  # (batcher.PrioritySource)
            lay.add(ring_required_bytes(self._doorbell_cap, agents), name="doorbell")
        lay.add(latches_required_bytes(table_size), name="latches")
        if self._arena_plan is not None:
            plan = self._arena_plan
            lay.add(slab_required_bytes(plan.slot_bytes, plan.n_slots), align=4096, name="arena")
            if plan.large_slots:
                lay.add(
                    slab_required_bytes(plan.large_slot_bytes, plan.large_slots), align=4096, name="large"
                )
        pool_class.add_sections(lay, config, table_size, len(placements))
        self.region, self._fd = pool_class.create_region(lay.size_bytes, config.name)
        self.region_node = self._bind_region(placements)
        self._offsets = dict(lay.offsets)
        self.ring = Ring.create(
            self.region, options.queue_type, ring_cap, offset=lay.offsets["requests"], max_agents=agents
        )
        self._spin_ns = options.spin_us * 1000
        self.ring.spin_ns = self._spin_ns  # the thread pool's handle: idle workers poll before sleeping
        self.level_rings = [self.ring] + [
            Ring.create(
                self.region,
                options.queue_type,
                ring_capacity(self._level_max[lv - 1]),
                offset=lay.offsets[f"requests_{lv}"],
                max_agents=agents,
            )
            for lv in range(2, self.levels + 1)
        ]
        self.doorbell: Ring | None = None
        if self.levels > 1:
            self.doorbell = Ring.create(
                self.region,
                options.queue_type,
                self._doorbell_cap,
                offset=lay.offsets["doorbell"],
                max_agents=agents,
            )
            self.doorbell.spin_ns = self._spin_ns
        self.table = RequestTable(
            table_size,
            Latches.create(
                self.region,
                table_size,
                offset=lay.offsets["latches"],
                shared=options.worker_mode == "process",
            ),
        )
        self.arena: SlabPool | None = None
        if self._arena_plan is not None:
            plan = self._arena_plan
            self.arena = SlabPool.create(
                self.region, plan.slot_bytes, plan.n_slots, offset=lay.offsets["arena"]
            )
        # the large arena (GPU models, ArenaPlan): its slot i is request slot arena.n_slots + i
        self.large: SlabPool | None = None
        if self._arena_plan is not None and self._arena_plan.large_slots:
            plan = self._arena_plan
            self.large = SlabPool.create(
                self.region, plan.large_slot_bytes, plan.large_slots, offset=lay.offsets["large"]
            )
        self.arena_fallbacks = 0  # requests too big for a slot (or arena full): copied to fresh arrays
        # slots lent to front ends receiving a body straight into them (``receive_slot``), at most
        # a quarter of the arena, so bodies still arriving never starve admitted requests
        self.receiving = 0
        self._lent: dict[int, memoryview] = {}  # slot -> the memory lent: released at close
        self._receiving_max = max(1, self.arena.n_slots // 4) if self.arena is not None else 0
        self.receiving_large = 0  # of them, large slots: at most a quarter of those too
        self._receiving_large_max = max(1, self.large.n_slots // 4) if self.large is not None else 0
        self.inputs_in_place = 0  # requests whose inputs were received in their slot: not copied
        self._late: list[InferRequest] = []  # synchronous requests answered at their deadline (invariant 5)
        self._late_lock = threading.Lock()  # taken only where _late is not empty, or to park one
        self.rejected = 0
        # ``rejected`` by reason (metrics): queue_full (a level's bound, records or arena slots
        # exhausted, the ring full), unloading, ring_refused
        self.rejections = {"queue_full": 0, "unloading": 0, "ring_refused": 0}
        self.closed = False
        self.lane = InlineLane(
            config, backend, model_path, options, placements, process_mode=options.worker_mode == "process"
        )
        self.placements = placements
        self._report: list[dict[str, Any]] | None = None  # placement_report's last, and when
        self._report_at = 0.0
        self.workers = pool_class(self, backend=backend, model_path=model_path, placements=placements)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, timeout_s: float = 120) -> None:
        """Start the workers, wait until every one has loaded, open the lane."""
        try:
            self.workers.start(timeout_s)
            self.lane.open()  # in this process: small models answer without a worker (lane.py)
        except BaseException:
            self.close()
            raise

    @property
    def ready(self) -> bool:
        return not self.closed and self.workers.ready

    def begin_shutdown(self) -> None:
        """Shutdown began: workers that die from now on are not replaced (what they held still
        fails at once)."""
        self.workers.stop()

    def close(self, timeout_s: float = 30) -> None:
        """Stop taking requests, let the workers finish what is queued, end them (see the top)."""
        if self.closed:
            return
        self.closed = True
        self.workers.stop()
        for ring in self.level_rings:
            ring.close()
        del ring  # no handle left in this frame: process mode unmaps the rings' region below
        if self.doorbell is not None:
            self.doorbell.close()
        self.workers.close(timeout_s)
        if self.options.worker_mode == "thread":  # worker processes answer through their pool
            self._fail_left()
        if self._late:  # every request is answered by now: the parked ones come back (invariant 5)
            self._reap_late()
        self.lane.close()
        self._revoke_lent()
        self.workers.release_memory()

    def _fail_left(self) -> None:
        """Requests left in the level rings after the thread workers ended, answered here
        (invariant 1): pushed just as the doorbell closed, so their token was refused
        (batcher.PrioritySource), or left by a worker that died while shutting down, or whose
        replacement gave up (thread_pool.py). Normally none: a worker ends at RingClosed, which a
        ring raises only once closed and empty."""
        for ring in self.level_rings:
            while True:
                try:
                    items = ring.pop_many(64, timeout_s=0)
                except (RingClosed, LrtError):  # drained; or a worker stuck past the join still
                    break  # owns a spsc ring's consumer end (it answers what it takes)
                if not items:
                    break
                for item in items:
                    doorbell = self.doorbell
                    if doorbell is not None:  # its token, if it has one: no worker may take it
                        with contextlib.suppress(RingClosed, LrtError):
                            doorbell.pop_many(1, timeout_s=0)
                    req = self.table.records[item.request_id]
                    if req.generation != request_generation(item) or req.times.completed_ns:
                        continue
                    req.error = ModelNotReady(f"model {self.config.name!r} unloaded before the request ran")
                    req.times.completed_ns = time.monotonic_ns()
                    self.table.complete_now(req)

    # ---- requests -------------------------------------------------------------------------

    def submit(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        on_done: Callable[[InferRequest], None] | None = None,
        priority: int = 0,
        received_slot: int = -1,
    ) -> InferRequest:
        """Queue the request without waiting. ``on_done``: the thread pool's worker calls it with
        the answer; the process pool's answers are read by the engine's event loop, which resolves
        its caller itself (process_pool.py), so there ``on_done`` is called only on the shutdown
        paths. None: the caller waits for the answer with ``wait``, then releases the request.
        ``priority``: its level, 1 (served first) .. ``levels``; 0: the model's default level.
        ``received_slot``: a slot from ``receive_slot`` whose payload holds ``inputs`` (their bytes
        as received): the request takes it over, whatever happens (it becomes the request's slot,
        or is freed)."""
        req = self._prepare(inputs, timeout_s, on_done, priority, received_slot)
        refused: str | None = None
        try:
            kind = ASYNC if on_done is not None else SYNC  # SYNC: the worker sets the latch itself
            pushed = try_push_request(self.level_rings[req.level - 1], req, kind)
            doorbell = self.doorbell
            if pushed and doorbell is not None:  # after the request (see batcher.PrioritySource)
                self._push_token(doorbell, req)
        except RingClosed:
            pushed = False
        except LrtError as e:
            pushed, refused = False, str(e)
        if not pushed:
            self._refuse(req, refused)
        return req

    def run(
        self, inputs: Mapping[str, Any], *, timeout_s: float | None = None, priority: int = 0
    ) -> InferRequest:
        """Synchronous: queue the request and wait for it in this thread (polling ``spin_us``,
        then sleeping, with the GIL released from the push on). Returns it answered; the caller
        reads it, then releases it. With a deadline the wait ends there: RequestTimeout, and the
        request is parked (invariant 5)."""
        req = self._prepare(inputs, timeout_s, None, priority)
        refused: str | None = None
        late = False
        try:
            doorbell, bounded = self.doorbell, req.deadline_ns != 0
            if doorbell is None and not bounded:
                pushed = push_request_wait(self.ring, req, self.table.latches, self._spin_ns)
            else:  # the request to its level, then its token (batcher.PrioritySource), and wait
                pushed = try_push_request(self.level_rings[req.level - 1], req, SYNC)
                if pushed and doorbell is not None and not self._push_token(doorbell, req, wait=not bounded):
                    # no token (the doorbell closed: unloading): in flight all the same, and
                    # answered by close (_fail_left); wait for that, bounded
                    self.table.latches.wait(req.index, timeout_s=ABANDON_WAIT_S)
                elif pushed and bounded:
                    late = not self._wait_until_deadline(req)
        except RingClosed:
            pushed = False
        except LrtError as e:  # raised before the push took effect (e.g. too many producer threads)
            pushed, refused = False, str(e)
        except BaseException:  # e.g. KeyboardInterrupt while waiting: the request is in flight
            self._abandon(req)
            raise
        if not pushed:
            self._refuse(req, refused)
        if late:
            self._park(req)
        self.workers.collect(req)
        return req

    def wait(self, req: InferRequest, timeout_s: float | None = None) -> bool:
        """Wait for a request ``submit`` queued without ``on_done`` (polling ``spin_us``, then
        sleeping, GIL released); True once it is answered (its outputs or error set), False if
        ``timeout_s`` passed first."""
        if not self.table.latches.wait(req.index, timeout_s=timeout_s, spin_ns=self._spin_ns):
            return False
        self.workers.collect(req)
        return True

    def _wait_until_deadline(self, req: InferRequest) -> bool:
        """Wait for the worker's answer until just past the request's deadline; False if none came."""
        remaining_s = (req.deadline_ns - time.monotonic_ns()) / 1e9 + SYNC_DEADLINE_SLACK_S
        return self.table.latches.wait(req.index, timeout_s=max(remaining_s, 0.0), spin_ns=self._spin_ns)

    def _park(self, req: InferRequest) -> None:
        """No worker answered by the deadline: cancel the request, park it with its record and
        slot, and answer the caller with RequestTimeout (invariant 5)."""
        waited_us = (time.monotonic_ns() - req.times.received_ns) // 1000  # before another thread may reap it
        error = RequestTimeout(
            f"model {self.config.name!r}: deadline passed after {waited_us} us, before a worker answered"
        )
        self.cancel(req)  # a worker that has not taken it yet skips it
        with self._late_lock:
            self._late.append(req)
        raise error

    def _reap_late(self) -> None:
        """Release the parked requests whose worker has answered since (invariant 5)."""
        with self._late_lock:
            done = [r for r in self._late if self.table.latches.is_set(r.index)]
            for r in done:
                self._late.remove(r)
        for r in done:
            try:
                self.workers.collect(r)  # process mode: its answer read and counted, as if awaited
            finally:
                self.release(r)

    def run_inline(
        self,
        inputs: Mapping[str, Any],
        times: StageTimes | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> dict[str, Array] | None:
        """The outputs, computed in this thread now, or None: submit it (engine/lane.py). Without
        ``times`` (the front ends' way) the stage times are the lane's own and the outputs may be
        its bound arrays: both valid until the lane's next request (lane.py invariant 5). A
        request for a priority level other than the model's default is always submitted: levels
        are scheduled in the queue, and the lane holds the default level's queue policy only."""
        if self.closed:
            return None
        db = self.config.dynamic_batching
        if priority and db is not None and db.level_of(priority) != db.level_of(0):
            return None
        return self.lane.run(inputs, self.queued(), times, timeout_s)

    def _push_token(self, doorbell: Ring, req: InferRequest, wait: bool = False) -> bool:
        """The token of a request already in its level ring (``wait``: and wait for its answer,
        ``push_request_wait``). False if the doorbell refused it: it is closed (the doorbell holds
        as many tokens as the level rings hold requests, so it is never full); the request then
        stays in flight and ``close`` answers it (``_fail_left``)."""
        try:
            if wait:
                return push_request_wait(doorbell, req, self.table.latches, self._spin_ns)
            return doorbell.try_push(req.index)
        except (RingClosed, LrtError):
            return False

    def requeue(self, req: InferRequest) -> bool:
        """Put a request a worker took back at the tail of the lowest level (timeout_action DELAY,
        batcher.DelayingSource); False if the ring refused it (the worker then runs it)."""
        try:
            if not try_push_request(self.level_rings[-1], req):
                return False
        except (RingClosed, LrtError):
            return False
        if self.doorbell is not None:
            self._push_token(self.doorbell, req)  # after the request (batcher.PrioritySource)
        return True

    def queued(self) -> int:
        """Requests waiting for a worker, at every level."""
        doorbell = self.doorbell
        return len(self.ring) if doorbell is None else len(doorbell)

    # ---- bodies received in place (front ends) ------------------------------------------------

    def receive_slot(self, payload_bytes: int) -> tuple[int, memoryview] | None:
        """An arena slot (a large one for a bigger payload, where the model has them) lent to a
        front end to receive a request's tensor bytes into as they arrive (the request's one
        copy), and the memory to receive them into; None when the model has no arena, the payload
        does not fit a slot, or a quarter of the arena's slot count is already lent. Give it back
        with ``submit(received_slot=...)`` or ``return_slot``. The view is exactly
        ``payload_bytes`` long; slices of it must not outlive the request."""
        arena = self.arena
        if arena is None or self.closed or self.receiving >= self._receiving_max:
            return None
        if self._late:
            self._reap_late()
        large, slot = self.large, None
        if payload_bytes <= arena.slot_bytes - DATA_AT:  # the slot's data area (received_payload)
            slot = arena.try_alloc()
        elif (
            large is not None
            and payload_bytes <= large.slot_bytes - DATA_AT
            and self.receiving_large < self._receiving_large_max
        ):
            big = large.try_alloc()
            slot = None if big is None else arena.n_slots + big
        if slot is None:
            return None
        # the one view of the slot lent (no other view shares it): releasing it at close lets the
        # region unmap (_revoke_lent)
        payload = received_payload(self._slot_view(slot))[:payload_bytes]
        self.receiving += 1
        self.receiving_large += slot >= arena.n_slots
        self._lent[slot] = payload
        return slot, payload

    def _unlend(self, slot: int) -> None:
        """A lent slot is no longer being received into (it is the request's now, or freed)."""
        self.receiving -= 1
        if self.arena is not None and slot >= self.arena.n_slots:
            self.receiving_large -= 1
        self._lent.pop(slot, None)

    def return_slot(self, slot: int) -> None:
        """A slot from ``receive_slot`` whose request never reached ``submit``."""
        self._unlend(slot)
        self._free_slot(slot)

    def _revoke_lent(self) -> None:
        """At close: the memory lent to front ends still receiving is released, so the region can
        be unmapped (a front end writing into it then gets ValueError and answers 503; its
        ``submit`` is refused since the runtime is closed)."""
        for view in list(self._lent.values()):
            with contextlib.suppress(BufferError):  # arrays made from it right now: they go soon
                view.release()

    def _prepare(
        self,
        inputs: Mapping[str, Any],
        timeout_s: float | None,
        on_done: Callable[[InferRequest], None] | None,
        priority: int = 0,
        received_slot: int = -1,
    ) -> InferRequest:
        """Admission: refuse when unloading, validate, check the queue bound of the request's
        priority level, take a record (and a slot), stamp arrival, set the deadline from the
        level's queue policy, copy the inputs in (or adopt them where they were received)."""
        if self._late:  # parked requests answered since give their records and slots back
            self._reap_late()
        if received_slot < 0:
            return self._admit(inputs, timeout_s, on_done, priority, -1)
        adopted = False
        try:
            req = self._admit(inputs, timeout_s, on_done, priority, received_slot)
            adopted = req.slot == received_slot
            return req
        finally:  # the slot is the request's now, or (refused, or copied from) freed here
            self._unlend(received_slot)
            if not adopted:
                self._free_slot(received_slot)

    def _admit(
        self,
        inputs: Mapping[str, Any],
        timeout_s: float | None,
        on_done: Callable[[InferRequest], None] | None,
        priority: int,
        received_slot: int,
    ) -> InferRequest:
        received_ns = time.monotonic_ns()
        config = self.config
        if self.closed:
            raise ModelNotReady(f"model {config.name!r} is unloading")
        db = config.dynamic_batching
        if priority and (
            isinstance(priority, bool) or not isinstance(priority, int) or not 0 < priority <= self.levels
        ):
            raise InvalidInput(
                f"model {config.name!r}: priority must be 0 (the default level) .. {self.levels} "
                f"(dynamic_batching.priority_levels), got {priority!r}"
            )
        level = db.level_of(priority) if db is not None else 1
        arrays, rows = self._check_inputs(inputs)
        level_max = self._level_max[level - 1]
        if len(self.level_rings[level - 1]) >= level_max:
            self.rejected += 1
            self.rejections["queue_full"] += 1
            where = f"priority level {level}: " if self.levels > 1 else ""
            raise QueueFull(
                f"model {config.name!r}: queue full ({where}max_queue_size: {level_max} requests waiting)"
            )
        req = self.table.acquire()
        if req is None:
            self.rejected += 1
            self.rejections["queue_full"] += 1
            raise QueueFull(
                f"model {config.name!r}: all {len(self.table.records)} request records in use "
                "(requests queued, running, or answered but not yet collected)"
            )
        req.times.received_ns = received_ns
        req.rows = rows
        req.level = level
        if db is not None:
            policy = self._policies[level - 1]
            if timeout_s is None or not policy.allow_timeout_override:
                timeout_s = policy.default_timeout_us / 1e6 if policy.default_timeout_us else None
            if policy.timeout_action == "DELAY":  # past its timeout it is not refused: it waits
                if timeout_s is not None:  # behind the others, then runs (batcher.DelayingSource)
                    req.delay_ns = received_ns + int(timeout_s * 1e9)
                timeout_s = None
        if timeout_s is not None:
            req.deadline_ns = received_ns + int(timeout_s * 1e9)
        try:
            req.inputs = self._copy_in(req, arrays, received_slot)
        except BaseException:
            self.table.release(req)
            raise
        req.generation += 1
        req.on_done = on_done
        self.workers.admitted(req)
        req.times.enqueued_ns = time.monotonic_ns()
        return req

    def _copy_in(
        self, req: InferRequest, arrays: dict[str, Array], received_slot: int = -1
    ) -> dict[str, Array]:
        """The one copy of the request's tensors: into an arena slot (slot_layout.py; the header
        too when the pool's workers read it from another process), or into fresh arrays. With a
        ``received_slot`` whose payload holds them as received, none: the slot becomes the
        request's (``_prepare`` frees it when they cannot be used in place and are copied)."""
        arena, plan = self.arena, self._arena_plan
        if (
            received_slot >= 0
            and arena is not None
            and plan is not None
            and adopt_inputs(self._slot_view(received_slot), arrays, describe=plan.required)
        ):
            req.slot = received_slot
            self.inputs_in_place += 1
            return arrays
        if arena is not None and plan is not None:
            describe = plan.required
            if describe or all(a.dtype != np.object_ for a in arrays.values()):
                large = self.large  # a GPU model's request too big for an arena slot: a large one
                if large is not None and payload_bytes(arrays) > arena.slot_bytes - DATA_AT:
                    placed = self._take_slot(large, arena.n_slots, req, arrays, describe)
                else:
                    placed = self._take_slot(arena, 0, req, arrays, describe)
                if placed is not None:
                    return placed
                if plan.required:
                    self.rejected += 1
                    self.rejections["queue_full"] += 1
                    raise QueueFull(
                        f"model {self.config.name!r}: arena full: all {arena.n_slots} slots in use (one "
                        f"per request in flight, {arena.slot_bytes} bytes each: max_batch_size rows of "
                        f"every tensor; the arena is capped at {ARENA_BUDGET_BYTES >> 20} MiB per model)"
                    )
            self.arena_fallbacks += 1
        return {name: np.array(a, copy=True) for name, a in arrays.items()}

    def _take_slot(
        self, pool: SlabPool, base: int, req: InferRequest, arrays: dict[str, Array], describe: bool
    ) -> dict[str, Array] | None:
        """The inputs written into a free slot of ``pool`` (the request's slot: ``base`` + its
        index), or None when none is free or they do not fit one (the process pool refuses that
        request: InvalidInput)."""
        slot = pool.try_alloc()
        if slot is None:
            return None
        try:
            placed = write_inputs(pool.view(slot), arrays, describe=describe)
        except SlotTooSmall as e:
            pool.free(slot)
            plan = self._arena_plan
            if plan is not None and plan.required:
                raise InvalidInput(f"model {self.config.name!r}: {e}") from None
            return None
        except BaseException:
            pool.free(slot)
            raise
        req.slot = base + slot
        return placed

    def _slot_view(self, slot: int) -> memoryview:
        """A request slot's memory: the arena's, or the large arena's past the arena's last index."""
        arena = self.arena
        assert arena is not None
        if slot < arena.n_slots:
            return arena.view(slot)
        assert self.large is not None
        return self.large.view(slot - arena.n_slots)

    def _free_slot(self, slot: int) -> None:
        """Back to its pool: the arena's, or the large arena's past the arena's last index."""
        arena = self.arena
        if arena is None:
            return
        if slot < arena.n_slots:
            arena.free(slot)
        elif self.large is not None:
            self.large.free(slot - arena.n_slots)

    def _refuse(self, req: InferRequest, refused: str | None = None) -> None:
        """The ring refused the request (full, closed by an unload, or refused by the ring):
        return its record and arena slot, answer at once."""
        self.release(req)
        self.rejected += 1
        config = self.config
        if self.closed:
            self.rejections["unloading"] += 1
            raise ModelNotReady(f"model {config.name!r} is unloading")
        if refused is not None:
            self.rejections["ring_refused"] += 1
            raise EngineError(f"model {config.name!r}: the request ring refused the request: {refused}")
        self.rejections["queue_full"] += 1
        raise QueueFull(
            f"model {config.name!r}: queue full (max_queue_size: {self._max_queue} requests waiting)"
        )

    def _abandon(self, req: InferRequest) -> None:
        """A synchronous caller stopped waiting (a signal handler raised): cancel the request and
        wait, uninterruptibly and bounded, for its answer so that its record can be released."""
        self.cancel(req)
        try:
            done = self.table.latches.wait(req.index, timeout_s=ABANDON_WAIT_S)
        except BaseException:
            done = False
        if done:
            self.release(req)

    def cancel(self, req: InferRequest) -> None:
        req.cancelled = True
        self.workers.cancel(req)

    def release(self, req: InferRequest) -> None:
        """The caller has read the answer: free the request's slot and record (invariant 4). A
        request answered at its deadline (engine.py) is freed once its worker has answered too."""
        if req.answered_early and not req.worker_answered:
            req.caller_released = True
            return
        slot = req.slot
        if slot >= 0:
            req.slot = -1
            self._free_slot(slot)
        self.table.release(req)

    def _bind_region(self, placements: list[Placement]) -> int:
        """Bind the model's region (its request ring, arena slots, request table and, in process
        mode, the completion ring) to its workers' node when they all have the same one and bind
        memory; before anything touches it, so no page has to move. Returns the node, or -1 (the
        workers span nodes, or first touch: the pages land where they are first written)."""
        nodes = {p.node for p in placements}
        if len(nodes) != 1 or not placements[0].bind_memory or placements[0].node < 0:
            return -1
        node = placements[0].node
        try:
            bind_memory(self.region.address, self.region.size, node)
        except (OSError, ValueError) as exc:
            logger.warning(
                "placement: model %s: region not bound to node %d: %s", self.config.name, node, exc
            )
            return -1
        return node

    # ---- statistics -----------------------------------------------------------------------

    def placement_report(self, max_age_s: float = 0.0) -> list[dict[str, Any]]:
        """Each worker's planned place and where its memory is, read from procfs: the memory policy
        its thread runs under (``bind:N`` once bound), the share of its process's resident memory
        on its node (thread mode: the engine's whole process, the same for every worker), and the
        share of the model's region (rings, arena, table) on it. One numa_maps read per process
        (the kernel walks its page tables) and one line per worker: for statistics and metrics,
        never on the request path; ``max_age_s`` > 0 returns the last report if it is that recent
        (the metrics scrape does)."""
        now = time.monotonic()
        if self._report is not None and now - self._report_at <= max_age_s:
            return self._report
        tasks = self.workers.tasks()
        maps: dict[int, list[Any]] = {}
        for pid in {os.getpid(), *(pid for pid, _ in tasks if pid)}:
            try:
                maps[pid] = read_numa_maps(pid)
            except (OSError, LocalityError):
                maps[pid] = []  # the worker went meanwhile, or no NUMA support in this kernel
        own = maps[os.getpid()]  # the region as this process maps it (a worker process maps it elsewhere)
        region = (self.region.address, self.region.address + self.region.size)
        out = []
        for i, ((pid, tid), p) in enumerate(zip(tasks, self.placements, strict=True)):
            bound = tid and p.node >= 0
            out.append(
                {
                    "worker": i,
                    "cpus": list(p.cores),
                    "threads": p.intra_op_threads,
                    "node": p.node,
                    "pid": pid,
                    "own_process": bool(pid) and pid != os.getpid(),  # process mode: its share is its own
                    "memory_policy": thread_policy(pid, tid) if bound else None,
                    "local_share": locality(maps[pid], p.node).share if bound and maps.get(pid) else None,
                    "region_node": self.region_node,  # the model's region is bound there (-1: not)
                    "region_local_share": locality(own, p.node, [region]).share
                    if own and p.node >= 0
                    else None,
                }
            )
        self._report, self._report_at = out, now
        return out

    def statistics(self) -> dict[str, Any]:
        """Per model version; the same keys and meanings in both pools."""
        total = WorkerStats()
        extra = self.workers.statistics(total)
        total.add(self.lane.stats)  # requests answered inline count like any other (lane.py)
        arena = self.arena
        return {
            "name": self.config.name,
            "version": self.version,
            "ready": self.ready,
            "workers": self.workers.size,
            "worker_mode": self.options.worker_mode,
            "queue_type": self.options.queue_type,
            "allocator_type": self.options.allocator_type,
            "requests": total.requests,
            "batches": total.batches,
            "failures": total.failures,
            "expired": total.expired,
            "cancelled": total.cancelled,
            "rejected": self.rejected,
            "rejections": dict(self.rejections),
            "arena_fallbacks": self.arena_fallbacks,
            "inputs_in_place": self.inputs_in_place,  # received into their slot: never copied
            "queue_ns": total.queue_ns,
            "input_ns": total.input_ns,
            "infer_ns": total.infer_ns,
            "output_ns": total.output_ns,
            "batch_rows": dict(sorted(total.batch_rows.items())),
            "batch_ns": dict(sorted(total.batch_ns.items())),  # rows -> [input, infer, output] ns
            "queue_buckets": total.queue_buckets,  # engine/histograms.py: DURATION_BOUNDS_NS
            "compute_buckets": total.compute_buckets,
            "queued": self.queued() if not self.closed else 0,
            "arena": arena.stats() if arena is not None else None,
            "large_arena": self.large.stats() if self.large is not None else None,
            "ring": self.ring.stats() if not self.closed else None,
            "lane": self.lane.describe(),
            # what its instances do: GPU instances batch as configured (thread_pool.py)
            "batching": self.options.batching if any(p.gpu < 0 for p in self.placements) else "fixed",
            **extra,
        }
