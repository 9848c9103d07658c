"""One batch, run: the step every worker takes, whatever pool it belongs to.

``execute_batch(plan, session, batch, sink)`` is the whole of it, for a worker thread and for a
worker process alike; the two differ only in their ``Sink``, which says where a request's inputs
are, how an answer or an error reaches its caller, and what is counted where:
  - thread pool (worker.py): the request record itself; answers are the model's own arrays,
    completed through the request table;
  - process pool (process_worker.py): the request's arena slot in shared memory; answers are
    written into the slot and reported through the completion ring or the caller's latch.

Steps, in order:
  1. every request taken is stamped dequeued; one cancelled or past its deadline is answered at
     once (never run);
  2. the rest are grouped by the non-batch shape of their inputs (only models with variable
     dimensions can differ), first come first kept;
  3. each group is gathered into the pre-allocated batch buffers, run once, counted (before any
     answer goes out, so a caller that reads the statistics once answered sees its request), and
     each request answered with exactly its own rows.

Invariant: every request in ``batch`` is answered exactly once. An error from the model fails its
group with the model's message; any other error (gathering, splitting, writing an answer) fails
each request of the group not yet answered, and the worker goes on to its next batch.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from lumenrt.backends.base import BackendSession
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.descriptors import request_generation
from lumenrt.engine.request import Array, InferRequest
from lumenrt.native import Item

E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)


def timed_out_message(waited_ns: int) -> str:
    return f"request timed out after {waited_ns // 1000} us in the queue; not run"


CANCELLED_MESSAGE = "request cancelled before it ran"


class Sink(Protocol[E_contra]):
    """Where a pool's requests come from and where their answers go (see the top)."""

    def inputs(self, request: E_contra) -> dict[str, Array]:
        """The request's input tensors (views, no copy)."""
        ...

    def rows(self, request: E_contra) -> int: ...

    def dequeue(self, request: E_contra, now_ns: int) -> bool:
        """Stamp the request dequeued; answer it now if it was cancelled or has expired.
        True: answered (it does not run)."""
        ...

    def ran(self, n_requests: int, rows: int, start_ns: int, end_ns: int) -> None:
        """Count a batch the model ran (before its answers go out)."""
        ...

    def answer(
        self, request: E_contra, outputs: dict[str, Array], start_ns: int, end_ns: int, rows: int, now_ns: int
    ) -> None:
        """Answer with ``outputs`` (exactly the request's rows); ``rows``: its batch's rows."""
        ...

    def fail(self, request: E_contra, message: str, cause: BaseException) -> None: ...

    def answered(self, request: E_contra) -> bool: ...


@dataclass(slots=True)
class BatchPlan:
    """What a worker fixes at load for its model: the batch buffers (owned by the worker, reused
    for every batch of fixed-shape inputs) and whether requests can differ in shape."""

    config: ModelConfig
    buffers: dict[str, Array] = field(default_factory=dict)
    variable: bool = False


def current_records(items: Sequence[Item], records: list[InferRequest]) -> list[InferRequest]:
    """The request records a batch of descriptors names, less any whose record was answered and
    reused meanwhile (its generation moved on: not this request)."""
    batch = [records[item.request_id] for item in items]
    if any(r.generation != request_generation(i) for r, i in zip(batch, items, strict=True)):
        batch = [r for r, i in zip(batch, items, strict=True) if r.generation == request_generation(i)]
    return batch


def execute_batch(plan: BatchPlan, session: BackendSession, batch: Sequence[E], sink: Sink[E]) -> int:
    """Run ``batch`` (see the top); never raises for a request's sake. Returns the rows of the one
    model call that ran the whole batch, or 0 when it took none (every request answered at once,
    or a failure) or several (shape groups): what adaptive batching may learn from (batch_cost.py)."""
    now_ns = time.monotonic_ns()
    live = [request for request in batch if not sink.dequeue(request, now_ns)]
    if not live:
        return 0
    groups = [live]
    if plan.variable and len(live) > 1:
        groups = [[live[i] for i in g] for g in shape_groups([sink.inputs(r) for r in live])]
    rows = 0
    for group in groups:
        try:
            rows = _run_group(plan, session, group, sink, now_ns)
        except Exception as e:  # never leave a request unanswered (see the top)
            rows = 0
            message = f"model {plan.config.name!r}: could not run the batch: {type(e).__name__}: {e}"
            for request in group:
                if not sink.answered(request):
                    sink.fail(request, message, e)
    return rows if len(groups) == 1 and len(live) == len(batch) else 0


def _run_group(plan: BatchPlan, session: BackendSession, group: list[E], sink: Sink[E], now_ns: int) -> int:
    """Requests whose inputs concatenate as one batch: gather, run once, answer each. Returns the
    rows run (0: the model failed)."""
    config = plan.config
    inputs = (
        sink.inputs(group[0])
        if len(group) == 1
        else gather(config, plan.buffers, [sink.inputs(r) for r in group])
    )
    rows = sum(sink.rows(r) for r in group)
    start_ns = time.monotonic_ns()
    try:
        outputs = session.run(inputs)
    except Exception as e:
        message = f"model {config.name!r} failed: {type(e).__name__}: {e}"
        for request in group:
            sink.fail(request, message, e)
        return 0
    end_ns = time.monotonic_ns()
    sink.ran(len(group), rows, start_ns, end_ns)
    if len(group) == 1 or config.max_batch_size == 0:
        for request in group:
            sink.answer(request, outputs, start_ns, end_ns, rows, now_ns)
        return rows
    offset = 0
    for request in group:
        n = sink.rows(request)
        sink.answer(
            request,
            {name: out[offset : offset + n] for name, out in outputs.items()},
            start_ns,
            end_ns,
            rows,
            now_ns,
        )
        offset += n
    return rows


def shape_groups(parts: list[dict[str, Array]]) -> list[list[int]]:
    """Indices of ``parts`` grouped by the non-batch shape of every input, first-come order kept:
    each group's inputs concatenate row-wise."""
    groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for i, p in enumerate(parts):
        groups.setdefault(tuple(a.shape[1:] for a in p.values()), []).append(i)
    return list(groups.values())


def gather(config: ModelConfig, buffers: dict[str, Array], parts: list[dict[str, Array]]) -> dict[str, Array]:
    """Concatenate several requests' inputs row-wise, into the batch buffers where possible."""
    rows = sum(int(next(iter(p.values())).shape[0]) for p in parts)
    gathered: dict[str, Array] = {}
    for spec in config.inputs:
        arrays = [p[spec.name] for p in parts]
        buffer = buffers.get(spec.name)
        gathered[spec.name] = (
            np.concatenate(arrays, out=buffer[:rows]) if buffer is not None else np.concatenate(arrays)
        )
    return gathered
