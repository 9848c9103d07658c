"""``lumenrt.Engine``: the in-process API over a model repository.

    with Engine() as engine:                       # the built-in repository, every model loaded
        result = engine.infer("digits_mlp", {"input": x})
        result.outputs["probabilities"], result.times.compute_end_ns

    result = await engine.infer_async("squeezenet", {"data": image}, timeout_s=0.5)

Async completions travel back through a completion ring and an eventfd notifier watched by the
running event loop (``loop.add_reader``): a worker that finishes a request pushes its index and
wakes the loop only if the loop is asleep, so a busy loop pays no system call per completion.
Thread-mode workers push to the engine's ring; worker processes push to their model's own ring
in shared memory, which the loop drains itself (process_pool.py: ``attach``), so an answer from
a worker process crosses one ring and at most one wake-up, with no thread in between.

Inline completion: when the request just submitted is the only one outstanding, ``infer_async``
first polls the completion ring for up to ``spin_us`` with the GIL released (the worker runs
meanwhile). A small model's answer arrives within that window and the coroutine goes on without
suspending: no eventfd write, no epoll wake-up of the loop. Measured on digits_mlp over the TCP
protocol (``benchmarks/serve.py``). With other requests outstanding the loop never waits: they
may need it.
"""

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lumenrt.backends.base import Placement, get_backend
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.descriptors import answer_model_id, try_push_answer
from lumenrt.engine.placing import placements_of, plan_engine
from lumenrt.engine.process_pool import ProcessPool
from lumenrt.engine.repository import ModelNotFound, ModelRepository
from lumenrt.engine.request import (
    Array,
    EngineError,
    InferRequest,
    ModelNotReady,
    RequestTimeout,
    StageTimes,
)
from lumenrt.engine.runtime import ModelRuntime, RuntimeOptions
from lumenrt.engine.server_config import EngineConfig
from lumenrt.native import (
    MAX_AGENTS,
    NOTIFIER_BYTES,
    Layout,
    LrtError,
    Notifier,
    Region,
    Ring,
    ring_required_bytes,
)
from lumenrt.placement.plan import ModelPlan, Plan, round_robin
from lumenrt.placement.running import LOCALITY_WARN_BELOW

logger = logging.getLogger(__name__)

COMPLETION_CAPACITY = 1 << 16  # async completions in flight at once across all models (guessed ample)
# Its agent table (native/include/lrt/ring.h): every thread-mode worker of every model pushes to it,
# models loaded after it is made included, so no plan bounds it: the largest table (256 KiB beside
# the cells' 4 MiB; the wake check reads only the words the workers really use). A worker past it
# anyway (more than MAX_AGENTS threads) answers through ``overflow``.
COMPLETION_AGENTS = MAX_AGENTS
DEADLINE_SLACK_NS = (
    200_000  # a deadline this close is answered in the same timer pass (guessed: < 1 loop turn)
)


@dataclass(slots=True)
class InferResult:
    model: str
    version: int
    outputs: dict[str, Array]
    times: StageTimes


def capped(config: ModelConfig, batch_size: int) -> ModelConfig:
    """``engine.batch_size`` (0: no cap) lowers a batching model's max_batch_size to it: requests
    with more rows are refused, and no batch holds more; preferred sizes above it are dropped."""
    if batch_size <= 0 or config.max_batch_size <= batch_size:
        return config
    db = config.dynamic_batching
    if db is not None:
        db = replace(db, preferred_batch_size=tuple(b for b in db.preferred_batch_size if b <= batch_size))
    return replace(config, max_batch_size=batch_size, dynamic_batching=db)


def placements_for(n_workers: int, cores: tuple[int, ...]) -> list[Placement]:
    """``n_workers`` placed round-robin over ``cores`` (placement/plan.py's rule 8), one compute
    thread per core each."""
    return [Placement(cores=cpus, intra_op_threads=len(cpus)) for cpus in round_robin(n_workers, cores)]


class _AsyncCompletions:
    """Completion ring + notifier bound to one event loop.

    Invariant: every completion reaches the loop. A worker never waits on a full completion ring
    (it would stall every model behind one slow loop): what does not fit goes to ``overflow`` (a
    deque: append and popleft are atomic under the GIL), which ``drain`` empties too. The ring is
    sized so that this never happens in practice; ``overflowed`` counts the times it did."""

    def __init__(self, engine: "Engine") -> None:
        lay = Layout()
        ring_at = lay.add(ring_required_bytes(COMPLETION_CAPACITY, COMPLETION_AGENTS))
        note_at = lay.add(NOTIFIER_BYTES)
        self._region = Region.anonymous(lay.size_bytes)
        self.ring = Ring.create(
            self._region, "mpmc", COMPLETION_CAPACITY, offset=ring_at, max_agents=COMPLETION_AGENTS
        )
        self.notifier = Notifier.create(self._region, offset=note_at)
        self._engine = engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outstanding = 0  # submitted and not yet resolved (event loop thread only)
        self.overflow: deque[tuple[int, int]] = deque()  # (model id, request index)
        self.overflowed = 0
        # Deadlines of the requests in flight that have one: a heap of (deadline_ns, model id,
        # request index, generation), stale entries skipped when popped; one loop timer for the
        # earliest (``watch`` / ``_expire``, event loop thread only).
        self._deadlines: list[tuple[int, int, int, int]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_ns = 0
        self.answered_at_deadline = 0
        # the process pools this loop drains (ProcessPool.attach), as of engine._pools_version
        self.pools: list[ProcessPool] = []
        self._pools_seen = -1
        # Waits on this handle happen only in poll(): spin for the whole window, never sleep
        # (a futex wake-up costs ~10 us here, the whole of a small model's compute).
        self.ring.spin_ns = engine.settings.spin_us * 1000

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loop is loop:
            if self._pools_seen != self._engine._pools_version:
                self._attach_pools()
            return
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.notifier.fileno())
        if self._timer is not None:  # the old loop's deadlines: their callers went with it
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()
        self.loop = loop
        loop.add_reader(self.notifier.fileno(), self.drain)
        self.notifier.arm()
        self.drain()
        self._attach_pools()

    def _attach_pools(self) -> None:  # event loop thread
        """This loop drains every running process pool's completion ring (a pool moves here
        from another loop; one closing stays as it is)."""
        engine, loop = self._engine, self.loop
        assert loop is not None
        self._pools_seen = engine._pools_version
        self.pools = [
            rt.workers
            for rt in list(engine._by_id.values())  # a load in another thread may add one meanwhile
            if isinstance(rt.workers, ProcessPool) and not rt.closed
        ]
        for pool in self.pools:
            pool.attach(loop, engine._resolve)

    def on_done(self, req: InferRequest) -> None:  # worker thread
        try:
            pushed = try_push_answer(self.ring, req)
        except LrtError:  # a thread past the ring's agent table (COMPLETION_AGENTS)
            pushed = False
        if not pushed:
            self.overflowed += 1
            self.overflow.append((req.model_id, req.index))
        self.notifier.notify()

    def poll(self, timeout_s: float, rt: ModelRuntime) -> None:  # event loop thread
        """Wait up to ``timeout_s`` (GIL released) for a completion of ``rt``'s; resolve what
        arrived. The notifier is disarmed meanwhile (notifier.h): the loop is awake, so the worker
        that answers makes no system call and leaves no wake-up behind for an answer taken here."""
        workers = rt.workers
        if isinstance(workers, ProcessPool):
            workers.poll(timeout_s)
            return
        rearm = self.notifier.disarm()  # False: a wake-up is pending, and its drain re-arms
        try:
            self._answer(self.ring.pop_many(256, timeout_s=timeout_s))
        finally:
            if rearm and self.loop is not None:  # not closed by a callback meanwhile
                self.notifier.arm()
                if len(self.ring) or self.overflow:  # re-check after arming (see notifier.h)
                    self.drain()

    def drain(self) -> None:  # event loop thread
        self.notifier.drain()
        overflow = self.overflow
        while True:
            self._answer(self.ring.pop_many(256, timeout_s=0))
            while overflow:
                self._answer_one(*overflow.popleft())
            self.notifier.arm()
            if len(self.ring) == 0 and not overflow:  # re-check after arming (see notifier.h)
                return

    def _answer(self, items: list[Any]) -> None:
        for item in items:
            self._answer_one(answer_model_id(item), item.request_id)

    def _answer_one(self, model_id: int, index: int) -> None:
        """An answer that fails (its caller's callback raised) is logged, so that the answers
        popped with it still reach their callers."""
        try:
            self._engine._resolve(model_id, index)
        except Exception:
            logger.exception("answering a request failed")

    def watch(self, req: InferRequest) -> None:  # event loop thread
        """Answer ``req`` at its deadline if no worker has by then (see Engine._answer_late)."""
        deadlines = self._deadlines
        heapq.heappush(deadlines, (req.deadline_ns, req.model_id, req.index, req.generation))
        if self._timer is None or req.deadline_ns < self._timer_ns:
            self._arm(req.deadline_ns)
        elif len(deadlines) > 2 * self.outstanding + 4096:  # stale entries (answered): amortized O(1)
            self._deadlines = [e for e in deadlines if self._engine._awaiting(*e[1:])]
            heapq.heapify(self._deadlines)

    def _arm(self, at_ns: int) -> None:
        loop = self.loop
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if loop is None:
            return
        self._timer_ns = at_ns
        self._timer = loop.call_later(max(at_ns - time.monotonic_ns(), 0) / 1e9, self._expire)

    def _expire(self) -> None:  # event loop thread: the timer
        self._timer = None
        self.drain()  # answers already back are answered as such, not as timeouts
        for pool in self.pools:
            if pool.loop is self.loop:  # not one closed meanwhile, nor moved to another loop
                pool.drain()
        deadlines = self._deadlines
        now_ns = time.monotonic_ns()
        while deadlines and deadlines[0][0] <= now_ns + DEADLINE_SLACK_NS:
            _, model_id, index, generation = heapq.heappop(deadlines)
            if self._engine._answer_late(model_id, index, generation, now_ns):
                self.answered_at_deadline += 1
        if deadlines:
            self._arm(deadlines[0][0])

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.notifier.fileno())
        self.loop = None


class Engine:
    def __init__(
        self,
        repository: str | Path | ModelRepository | None = None,
        settings: EngineConfig | None = None,
        *,
        models: Iterable[str] | None = None,
        ingress_threads: int = 0,
    ) -> None:
        """``ingress_threads``: the busy threads of the caller's front ends, for the placement plan
        (``lumenrt serve``: 1, its event loop); the plan is ``self.plan``. No ``repository``: the
        built-in one, its default models unless ``models`` names others (INT8 variants included)."""
        if repository is None:
            from lumenrt.models.int8 import builtin_models

            repository, models = builtin_models(models)
        self.repository = (
            repository if isinstance(repository, ModelRepository) else ModelRepository(Path(repository))
        )
        settings = settings or EngineConfig()
        self.settings = settings
        self._runtimes: dict[str, dict[int, ModelRuntime]] = {}
        # every runtime an async completion may still name: the loaded ones, and closed ones until
        # their last record is released (pruned at each load)
        self._by_id: dict[int, ModelRuntime] = {}
        self._next_id = 0
        self._async: _AsyncCompletions | None = None
        self._pools_version = 0  # bumped when a process pool starts: the loop attaches it
        self.closed = False
        names = list(models) if models is not None else [m.name for m in self.repository.index()]
        self.ingress_threads = ingress_threads
        self._configs: dict[str, ModelConfig] = {}  # the models the plan is for
        self.plan: Plan | None = None
        try:
            found = {name: self.repository.load(name) for name in names}
            configs = {name: versions[-1].config for name, versions in found.items() if versions}
            plan = self._plan(configs, {})
            for name in names:
                self._start(name, found[name], plan)
            self.plan, self._configs = plan, configs
        except BaseException:
            self.close()
            raise

    # ---- models -----------------------------------------------------------------------------

    def load(self, name: str) -> None:
        """Load (or reload) every version the model's version policy selects. A model the plan
        does not know yet (or whose instance_group changed) is planned with the others; the models
        already running keep their places."""
        loaded = self.repository.load(name)
        plan, configs = self.plan, self._configs
        if loaded and (
            name not in configs
            or (configs[name].instance_group, configs[name].gpu_groups)
            != (loaded[-1].config.instance_group, loaded[-1].config.gpu_groups)
        ):
            configs = {**configs, name: loaded[-1].config}
            running = (
                {}
                if plan is None
                else {n: plan.model(n) for n in self._runtimes if n != name and n in configs}
            )
            plan = self._plan(configs, running)
        self._start(name, loaded, plan)
        self.plan, self._configs = plan, configs  # only once the model runs

    def _plan(self, configs: dict[str, ModelConfig], running: dict[str, ModelPlan]) -> Plan:
        plan = plan_engine(list(configs.values()), self.settings, self.ingress_threads, running=running)
        for warning in plan.warnings:
            logger.warning("placement: %s", warning)
        return plan

    def _start(self, name: str, loaded: list[Any], plan: Plan | None) -> None:
        fresh: dict[int, ModelRuntime] = {}
        try:
            for lm in loaded:
                runtime = ModelRuntime(
                    config=capped(lm.config, self.settings.batch_size),
                    version=lm.version,
                    model_path=lm.model_path,
                    backend=get_backend(lm.config.backend, lm.config.source),
                    placements=placements_of(
                        plan,
                        name,
                        pin=self.settings.pin,
                        # roundrobin is the placement before planning: pinning only
                        bind_memory=self.settings.memory_binding == "bind"
                        and self.settings.placement != "roundrobin",
                    )
                    if plan is not None
                    else [],
                    options=RuntimeOptions(
                        queue_type=self.settings.queue_type,
                        allocator_type=self.settings.allocator_type,
                        pin=self.settings.pin,
                        arena_slot_bytes=self.settings.arena_slot_bytes,
                        arena_slots=self.settings.arena_slots,
                        large_arena_bytes=self.settings.large_arena_bytes,
                        spin_us=self.settings.spin_us,
                        lane=self.settings.lane,
                        lane_max_us=self.settings.lane_max_us,
                        batching=self.settings.batching,
                        worker_mode=self.settings.worker_mode,
                    ),
                )
                runtime.model_id = self._next_id
                self._next_id += 1
                self._by_id[runtime.model_id] = runtime
                for rec in runtime.table.records:
                    rec.model_id = runtime.model_id
                fresh[lm.version] = runtime
                runtime.start()
                self._pools_version += 1
                self._check_locality(runtime)
        except BaseException:
            for rt in fresh.values():
                rt.close()
            raise
        old = self._runtimes.get(name, {})
        self._runtimes[name] = fresh
        for rt in old.values():
            rt.close()
        self._prune()

    def placement_report(self) -> dict[str, dict[int, list[dict[str, Any]]]]:
        """Every loaded model version's workers: planned CPUs, threads and node, and where their
        memory is (ModelRuntime.placement_report)."""
        return {
            name: {v: rt.placement_report() for v, rt in list(versions.items())}
            for name, versions in list(self._runtimes.items())  # a load may run meanwhile
        }

    def _check_locality(self, runtime: ModelRuntime) -> None:
        """Warn at load where a share means something: a worker process's own memory, and the
        model's bound region (a thread-mode worker's share is its whole process's, the same for
        workers on every node, so it is reported, never warned about)."""
        for w in runtime.placement_report():
            for key, what in (
                ("local_share", "its process's memory"),
                ("region_local_share", "the model's region"),
            ):
                share = w[key]
                if key == "local_share" and not w["own_process"]:
                    continue
                if key == "region_local_share" and w["region_node"] < 0:
                    continue
                if share is not None and share < LOCALITY_WARN_BELOW:
                    logger.warning(
                        "placement: model %s worker %d: %.1f%% of %s is on its node %d",
                        runtime.config.name,
                        w["worker"],
                        100 * share,
                        what,
                        w["node"],
                    )

    def unload(self, name: str) -> None:
        self._configs.pop(name, None)  # its CPUs go to the next model planned
        for rt in self._runtimes.pop(name, {}).values():
            rt.close()
        self._pools_version += 1  # the loop forgets its pools
        self._prune()

    def _prune(self) -> None:
        """Forget closed runtimes whose records are all back (no completion can name them)."""
        for model_id, rt in list(self._by_id.items()):
            if rt.closed and rt.table.free == len(rt.table.records):
                del self._by_id[model_id]

    def models(self) -> list[str]:
        return sorted(self._runtimes)

    def runtime(self, name: str, version: int | None = None) -> ModelRuntime:
        versions = self._runtimes.get(name)
        if not versions:
            raise ModelNotFound(
                f"unknown model {name!r} (loaded: {', '.join(self.models()) or 'none'})",
                self.repository.root / name,
            )
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise ModelNotFound(
                f"model {name!r} has no loaded version {version} (loaded: {sorted(versions)})",
                self.repository.root / name / str(version),
            )
        return versions[version]

    def ready(self, name: str | None = None, version: int | None = None) -> bool:
        if self.closed:
            return False
        if name is None:
            return all(rt.ready for versions in self._runtimes.values() for rt in versions.values())
        try:
            return self.runtime(name, version).ready
        except ModelNotFound:
            return False

    def metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        rt = self.runtime(name, version)
        cfg = rt.config
        lead = [-1] if cfg.max_batch_size > 0 else []

        def tensors(specs: Iterable[Any]) -> list[dict[str, Any]]:
            return [{"name": s.name, "datatype": s.datatype, "shape": lead + list(s.dims)} for s in specs]

        return {
            "name": cfg.name,
            "versions": [str(v) for v in sorted(self._runtimes[name])],
            "platform": cfg.backend,
            "inputs": tensors(cfg.inputs),
            "outputs": tensors(cfg.outputs),
            "max_batch_size": cfg.max_batch_size,
        }

    def statistics(self, name: str | None = None) -> list[dict[str, Any]]:
        names = [name] if name is not None else self.models()
        return [rt.statistics() for n in names for rt in self._runtimes.get(n, {}).values()]

    # ---- inference ---------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: int | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> InferResult:
        rt = self.runtime(model, version)
        if rt.lane.active:
            times = StageTimes()  # the caller keeps it: not the lane's own
            outputs = rt.run_inline(inputs, times, timeout_s, priority)
            if outputs is not None:
                return InferResult(rt.config.name, rt.version, outputs, times)
        req = rt.run(inputs, timeout_s=timeout_s, priority=priority)
        return self._finish(rt, req)

    def submit_callback(
        self,
        rt: ModelRuntime,
        inputs: Mapping[str, Any],
        on_answer: Callable[[InferRequest], None],
        context: Any = None,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        received_slot: int = -1,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> InferRequest:
        """Queue a request from the event loop thread without a Task or Future: ``on_answer(req)``
        runs in that thread once it is answered (``req.outputs`` or ``req.error``; ``req.context``
        is ``context``), by a worker or, if none has by then, at its deadline (504). The callee
        owns the request from then on: it reads it and calls ``rt.release(req)`` exactly once.
        Raises (EngineError, InvalidInput) when admission refuses, and then never calls back.
        Returns the request, to ``cancel`` it while ``req.context is context`` (it may already
        be answered and released when this returns: then its context is not). ``received_slot``:
        the arena slot the inputs were received in (``ModelRuntime.receive_slot``), taken over.
        ``loop``: the running loop, where the caller keeps it (else asked of asyncio, which on
        CPython 3.11 costs a getpid() system call a request)."""
        completions = self._bind(loop or asyncio.get_running_loop())
        req = rt.submit(
            inputs,
            timeout_s=timeout_s,
            on_done=completions.on_done,
            priority=priority,
            received_slot=received_slot,
        )
        req.on_answer = on_answer  # read by _resolve, in this thread, after this returns
        req.context = context
        completions.outstanding += 1
        if req.deadline_ns:
            completions.watch(req)
        if completions.outstanding == 1 and self.settings.spin_us:
            try:
                completions.poll(self.settings.spin_us / 1e6, rt)  # inline completion (see the top)
            except Exception:  # admitted, so not refused: the reader or its deadline answers it
                # (a callback that raises is logged where the answers are taken, not here)
                logger.exception("answering a request inline failed")
        return req

    def _bind(self, loop: asyncio.AbstractEventLoop) -> _AsyncCompletions:
        completions = self._async
        if completions is None:
            completions = self._async = _AsyncCompletions(self)
        completions.bind(loop)
        return completions

    async def infer_async(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: int | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> InferResult:
        """Answered by a worker, or at its deadline (RequestTimeout) if none has by then."""
        loop = asyncio.get_running_loop()
        rt = self.runtime(model, version)
        completions = self._bind(loop)  # after: a runtime that started since is attached here
        future: asyncio.Future[None] = loop.create_future()
        req = rt.submit(inputs, timeout_s=timeout_s, on_done=completions.on_done, priority=priority)
        req.future = future
        completions.outstanding += 1
        if req.deadline_ns:
            completions.watch(req)
        if completions.outstanding == 1 and self.settings.spin_us:
            completions.poll(self.settings.spin_us / 1e6, rt)  # inline completion (see the top)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # answered before the cancel landed
                rt.release(req)  # so this caller owns it (_resolve, _answer_late)
            else:
                rt.cancel(req)  # the worker skips it if not started; _resolve releases it
            raise
        return self._finish(rt, req)

    def _resolve(self, model_id: int, index: int) -> None:
        if self._async is not None:
            self._async.outstanding -= 1
        rt = self._by_id[model_id]
        req = rt.table.records[index]
        if req.answered_early:  # its caller had its answer at the deadline: free it once released
            req.worker_answered = True
            if req.caller_released:
                rt.release(req)
            return
        on_answer = req.on_answer
        if on_answer is not None:  # submit_callback: the callee reads and releases it
            on_answer(req)
            return
        future: asyncio.Future[None] | None = req.future
        if future is None or future.done():  # the caller went away (cancelled): nobody will read it
            rt.release(req)
            return
        future.set_result(None)

    def _awaiting(self, model_id: int, index: int, generation: int) -> bool:
        """True while that request is in flight for an asynchronous caller, not yet answered."""
        rt = self._by_id.get(model_id)
        if rt is None:
            return False
        req = rt.table.records[index]
        if req.generation != generation or req.answered_early:
            return False
        if req.on_answer is not None:
            return True
        future = req.future
        return future is not None and not future.done()

    def _answer_late(self, model_id: int, index: int, generation: int, now_ns: int) -> bool:
        """Its deadline passed and no worker has answered it: answer the caller now with a
        timeout (504); the worker's answer, when it comes, only frees the record (``_resolve``).
        A worker that reaches it later finds it expired and does not run it."""
        if not self._awaiting(model_id, index, generation):
            return False
        rt = self._by_id[model_id]
        req = rt.table.records[index]
        req.answered_early = True
        rt.cancel(req)  # a worker that takes it within DEADLINE_SLACK_NS of its deadline skips it too
        waited_us = (now_ns - req.times.received_ns) // 1000
        req.error = RequestTimeout(
            f"model {rt.config.name!r}: deadline passed after {waited_us} us, before a worker answered"
        )
        on_answer = req.on_answer
        if on_answer is not None:
            on_answer(req)
        else:
            req.future.set_result(None)
        return True

    def begin_shutdown(self) -> None:
        """Shutdown began (the server drains): no worker process is replaced from now on; what
        is queued still runs, and a worker that dies still fails what it held at once."""
        for versions in self._runtimes.values():
            for rt in versions.values():
                rt.begin_shutdown()

    def _finish(self, rt: ModelRuntime, req: InferRequest) -> InferResult:
        try:
            if req.error is not None:
                raise req.error
            assert req.outputs is not None
            return InferResult(rt.config.name, rt.version, req.outputs, req.times)
        finally:
            rt.release(req)

    # ---- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Readiness false, new requests refused, queued ones finish, workers joined."""
        if self.closed:
            return
        self.closed = True
        for versions in self._runtimes.values():
            for rt in versions.values():
                rt.close()
        if self._async is not None:
            self._async.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Engine", "EngineConfig", "EngineError", "InferResult", "ModelNotFound", "ModelNotReady"]
