"""A GPU instance's worker loop: one host thread feeding its device, two batches in flight.

The worker thread (worker.py, pinned to the CPU the plan gave this instance) loads the model onto
its device through the backend (``GpuBackend.load_gpu``), makes its streams and staging sets
(pipeline.py, staging.py), warms up, then loops:

    take a batch (blocking when nothing is in flight; when a batch is on the device, only what is
      queued now: Batcher.try_next_batch)
    gather its inputs straight into a free set's host buffers, issue it (Pipeline.launch)
    with two batches in flight, or nothing more queued: wait for the oldest (its own event only)
      and answer its requests from copies of their rows of the set's host outputs

so the host answers batch N-1 and gathers batch N+1 while batch N runs on the device.

Invariants
  1. Every request taken is answered exactly once (execute.py's invariant): a request that expired
     or was cancelled is answered when taken; a batch whose gather or launch fails, whose device
     work fails (DeviceError at its event) or whose answering fails is failed as a whole (those of
     its requests not yet answered), with a message naming the model and the device; the worker
     goes on to the next batch. At the end, batches still in flight are waited for and answered.
  2. A staging set is free or held by exactly one batch in flight; a batch in flight is answered
     before its set is refilled (pipeline.py invariant 2). At most ``SETS`` batches are in flight.
  3. Answers never point into staging buffers (which the next batches overwrite): each batch's
     outputs are copied out of the host buffers once, and each request gets its rows of the copy.
  4. With direct copies the device reads each request's inputs where admission put them (its
     arena slot) after ``launch`` returns; a request is answered, and its slot freed, only once
     its batch is done: after the wait for its ``copy_out_end``, or after ``settle`` when its
     launch or its device work failed.

Shutdown order
  1. the runtime closes the request ring; the loop takes what is left until RingClosed;
  2. the batches still in flight are waited for and answered, oldest first;
  3. ``close``: the streams finish (Pipeline.close), the program and the buffers are dropped, and
     the host memory registration (direct copies) is given back, before the runtime can unmap it.

A CUDA error that poisons the context (an illegal address, a device-side assert) fails every later
batch of every instance in this process too: CUDA cannot recover a context; the process must be
restarted. Errors CUDA reports when work is issued (out of memory, a bad launch) fail one batch.
"""

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.backends.base import Backend, GpuBackend, Placement
from lumenrt.engine.batcher import Batcher
from lumenrt.engine.config import ConfigError, ModelConfig
from lumenrt.engine.execute import Sink, current_records
from lumenrt.engine.gpu import devices
from lumenrt.engine.gpu.pipeline import Pipeline, Streams, graph_sizes
from lumenrt.engine.gpu.staging import SETS, StagingPlan, StagingSet
from lumenrt.engine.gpu.stats import DeviceStats, InstanceReport
from lumenrt.engine.request import Array, InferRequest
from lumenrt.native import Item, RingClosed

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Flight:
    """A batch on the device: its requests (answered when it is done) and its staging set."""

    requests: list[InferRequest]
    staging: StagingSet
    rows: int
    dequeued_ns: int
    issued_ns: int


def load_gpu_serving(
    backend: Backend, model_path: Path, config: ModelConfig, placement: Placement, host_memory: Any = None
) -> "GpuServing":
    """Load one GPU instance on ``placement.gpu``: what the backend needs is checked before any
    device is opened (a CPU-only machine is told what is missing, not that CUDA failed).
    ``host_memory``: the model's region holding its arena, registered with the device when
    ``optimization.cuda.direct_copies`` is on (requests copied out of it asynchronously)."""
    source = config.source or config.name
    if not isinstance(backend, GpuBackend):
        raise ConfigError(
            source,
            "instance_group",
            f"the {backend.name} backend has no GPU instances (KIND_GPU): the pytorch and onnxruntime backends do",
        )
    plan = StagingPlan.for_config(config)
    backend.check_gpu(config)
    device = devices.open_device(placement.gpu)
    streams = Streams.create(device, config.gpu.copy_streams)
    program = backend.load_gpu(model_path, config, device, streams.compute)
    try:
        pipeline = Pipeline(device, streams, plan, program, config.gpu, graph_sizes(config))
    except BaseException:
        program.close()
        raise
    registered = None
    if config.gpu.direct_copies and host_memory is None:
        logger.warning(
            "model %r: direct_copies without an arena (allocator_type standard): each request is "
            "copied to the device from its own pageable arrays, which CUDA does synchronously",
            config.name,
        )
    if config.gpu.direct_copies and host_memory is not None:
        try:
            registered = device.register_host(host_memory)
        except BaseException:
            pipeline.close()
            raise
    serving = GpuServing(
        pipeline, config, registered, len(memoryview(host_memory)) if registered is not None else 0
    )
    try:
        serving.warm_up(max(config.warmup, 1))  # the first run also proves the program end to end
    except BaseException:
        serving.close()
        raise
    return serving


class GpuServing:
    def __init__(
        self, pipeline: Pipeline, config: ModelConfig, registered: Any = None, registered_bytes: int = 0
    ) -> None:
        self.pipeline = pipeline
        self.config = config
        self._direct = config.gpu.direct_copies
        self._registered = registered  # the host memory registration this instance holds, if any
        self.stats = DeviceStats()
        plan = pipeline.plan
        self.report = InstanceReport(
            device=pipeline.device,
            owned_bytes=plan.device_bytes + pipeline.program.weight_bytes,
            pinned_bytes=sum(
                b.array.nbytes
                for s in pipeline.sets
                for b in (*s.host_in.values(), *s.host_out.values())
                if b.pinned
            ),
            stats=self.stats,
            registered_bytes=registered_bytes,
        )
        self._where = f"model {config.name!r} on {pipeline.device.name}"

    def warm_up(self, runs: int) -> None:
        """Zeros through the whole schedule (load time), by the path requests take (direct copies
        read the zeros of the set's staging buffer, as they would a request's slot)."""
        for i in range(runs):
            s = self.pipeline.sets[i % SETS]
            pieces = [(name, 0, host.array[:1]) for name, host in s.host_in.items()] if self._direct else []
            self.pipeline.launch(s, 1, pieces)
            self.pipeline.wait(s)

    def serve(self, batcher: Batcher[Item], records: list[InferRequest], sink: Sink[InferRequest]) -> None:
        flights: deque[Flight] = deque()
        free: deque[StagingSet] = deque(self.pipeline.sets)
        try:
            while True:
                try:
                    items = batcher.try_next_batch() if flights else batcher.next_batch()
                except RingClosed:
                    return
                if items:  # at most SETS - 1 in flight here: a set is free (invariant 2)
                    staging = free.popleft()
                    flight = self._issue(current_records(items, records), staging, sink)
                    if flight is None:
                        free.append(staging)
                    else:
                        flights.append(flight)
                if flights and (not items or len(flights) == SETS):
                    done = flights.popleft()
                    self._finish(done, sink)
                    free.append(done.staging)
        finally:
            while flights:  # shutdown step 2
                self._finish(flights.popleft(), sink)

    def _issue(self, batch: Sequence[InferRequest], s: StagingSet, sink: Sink[InferRequest]) -> Flight | None:
        now_ns = time.monotonic_ns()
        live = [r for r in batch if not sink.dequeue(r, now_ns)]
        if not live:
            return None
        rows = sum(sink.rows(r) for r in live)
        try:
            if self._direct:
                self.pipeline.launch(s, rows, self._pieces(live, sink))
                self.stats.direct_batches += 1
            else:
                self._gather(live, s, rows, sink)
                self.pipeline.launch(s, rows)
        except Exception as e:
            self.pipeline.settle(s)
            self.stats.failures += 1
            self._fail(live, sink, f"{self._where} failed: {type(e).__name__}: {e}", e)
            return None
        return Flight(live, s, rows, now_ns, time.monotonic_ns())

    def _gather(self, live: list[InferRequest], s: StagingSet, rows: int, sink: Sink[InferRequest]) -> None:
        """The batch's inputs straight into the set's host buffers (no other copy)."""
        batched = self.pipeline.plan.batched
        for name, host in s.host_in.items():
            dst = host.array
            if not batched:
                np.copyto(dst[0], sink.inputs(live[0])[name])
            elif len(live) == 1:
                np.copyto(dst[:rows], sink.inputs(live[0])[name])
            else:
                np.concatenate([sink.inputs(r)[name] for r in live], out=dst[:rows])

    def _pieces(self, live: list[InferRequest], sink: Sink[InferRequest]) -> list[tuple[str, int, Array]]:
        """Each request's inputs where admission put them, at their rows of the batch (no copy on
        the host: pipeline.py invariant 5 keeps them there until the batch is done)."""
        pieces = []
        if not self.pipeline.plan.batched:  # one request, no batch dimension: one row of the buffer
            return [(name, 0, a[np.newaxis]) for name, a in sink.inputs(live[0]).items()]
        row = 0
        for request in live:
            for name, array in sink.inputs(request).items():
                pieces.append((name, row, array))
            row += sink.rows(request)
        return pieces

    def _finish(self, flight: Flight, sink: Sink[InferRequest]) -> None:
        """Wait for the batch's own event, then answer each request with its rows (invariant 3)."""
        live, s, rows = flight.requests, flight.staging, flight.rows
        try:
            times = self.pipeline.wait(s)
        except Exception as e:
            self.pipeline.settle(s)  # invariant 4: nothing of the batch still reads its inputs
            self.stats.failures += 1
            self._fail(live, sink, f"{self._where} failed: {type(e).__name__}: {e}", e)
            return
        self.stats.add(times)
        # the stages as execute.py counts them (Triton's compute_input/infer/output): input = gather
        # and copy in, infer = the device's compute, output = copy out and answering
        start_ns = flight.issued_ns + times.copy_in_ns
        end_ns = start_ns + times.compute_ns
        batched = self.pipeline.plan.batched
        try:
            outputs: dict[str, Array] = {
                name: (host.array[:rows] if batched else host.array[0]).copy()
                for name, host in s.host_out.items()
            }
            sink.ran(len(live), rows, start_ns, end_ns)
            offset = 0
            for request in live:
                n = sink.rows(request)
                mine = (
                    outputs
                    if len(live) == 1 or not batched
                    else {k: v[offset : offset + n] for k, v in outputs.items()}
                )
                sink.answer(request, mine, start_ns, end_ns, rows, flight.dequeued_ns)
                offset += n
        except Exception as e:
            self._fail(
                [r for r in live if not sink.answered(r)],
                sink,
                f"{self._where}: could not answer the batch: {type(e).__name__}: {e}",
                e,
            )

    @staticmethod
    def _fail(
        requests: list[InferRequest], sink: Sink[InferRequest], message: str, cause: BaseException
    ) -> None:
        for request in requests:
            if not sink.answered(request):
                sink.fail(request, message, cause)

    def close(self) -> None:
        try:
            self.pipeline.close()  # the streams finish: nothing reads the registered memory after
        finally:
            if self._registered is not None:
                self.pipeline.device.unregister_host(self._registered)
                self._registered = None


def describe(serving: Any) -> InstanceReport | None:
    """A worker's GPU report, if it is a loaded GPU instance."""
    return serving.report if isinstance(serving, GpuServing) else None
