"""What each ring's descriptor fields mean: the one place that names them.

A native ring carries fixed 64-byte descriptors (``lumenrt.native.Item``: request_id, slot,
nbytes, t_ns, aux0, aux1, aux2, kind). Three rings use them, each with its own meaning; code reads
and writes them only through the names below, never through ``aux0``..``kind`` directly.

  ring         request_id        slot        aux0        aux1        aux2          kind
  requests     request record    arena slot  rows        generation  deadline_ns   ASYNC | SYNC
  completions  request record    arena slot  answer code generation  -             FROM_WORKER | FROM_SUPERVISOR
  answers      request record    -           -           -           -             model id

``requests``: ingress -> workers (both pools; slot is NO_SLOT when the request's tensors are not in
the arena). ``completions``: worker processes and the supervisor -> the event loop (process pool:
each model's own ring in shared memory). ``answers``: thread-pool workers, and the shutdown paths
of both pools (``on_done``) -> the event loop (engine.py, asynchronous callers).
"""

from lumenrt.engine.request import InferRequest
from lumenrt.native import Item, Latches, Ring

# Answer codes: a completion's aux0, and the status in an arena slot's header.
OK, TIMED_OUT, CANCELLED, FAILED, WORKER_DIED = 0, 1, 2, 3, 4
# Who sent a completion: a worker (its answer is in the slot) or the supervisor (the worker died).
FROM_WORKER, FROM_SUPERVISOR = 0, 1
# How a request is answered: ASYNC through the completion ring (its caller gave a callback);
# SYNC by the worker writing the code into the slot header and setting the caller's latch.
ASYNC, SYNC = 0, 1
# A request descriptor's slot when the request's tensors are not in the arena (fresh arrays).
NO_SLOT = 0xFFFFFFFF


def ring_capacity(n: int) -> int:
    """A ring's capacity for ``n`` entries: the smallest power of two >= max(n, 2)."""
    cap = 2
    while cap < n:
        cap *= 2
    return cap


# ---- requests ring --------------------------------------------------------------------------


def try_push_request(ring: Ring, req: InferRequest, kind: int = ASYNC) -> bool:
    """Push ``req``'s descriptor (ASYNC, or SYNC for a caller that waits on its latch itself)
    without waiting; False if the ring is full."""
    slot = req.slot if req.slot >= 0 else NO_SLOT
    return ring.try_push(req.index, slot, 0, 0, req.rows, req.generation, req.deadline_ns, kind)


def push_request_wait(ring: Ring, req: InferRequest, latches: Latches, spin_ns: int) -> bool:
    """Push ``req``'s descriptor (SYNC) and wait for its latch (``Ring.push_wait``)."""
    slot = req.slot if req.slot >= 0 else NO_SLOT
    return ring.push_wait(
        req.index,
        slot,
        0,
        0,
        req.rows,
        req.generation,
        req.deadline_ns,
        SYNC,
        latches=latches,
        latch=req.index,
        spin_ns=spin_ns,
    )


def request_rows(item: Item) -> int:
    return item.aux0


def request_generation(item: Item) -> int:
    return item.aux1


def request_deadline_ns(item: Item) -> int:
    """0: no deadline."""
    return item.aux2


def request_kind(item: Item) -> int:
    return item.kind


# ---- completions ring -----------------------------------------------------------------------


def push_completion(ring: Ring, request_id: int, slot: int, code: int, generation: int, source: int) -> None:
    ring.push(request_id, slot=slot, aux0=code, aux1=generation, kind=source)


def completion_code(item: Item) -> int:
    return item.aux0


def completion_generation(item: Item) -> int:
    return item.aux1


def completion_source(item: Item) -> int:
    return item.kind


# ---- answers ring ---------------------------------------------------------------------------


def try_push_answer(ring: Ring, req: InferRequest) -> bool:
    return ring.try_push(req.index, kind=req.model_id)


def answer_model_id(item: Item) -> int:
    return item.kind
