"""The implementations the queue benchmark (``benchmarks/queues.py``) compares, each behind one small
interface.

A :class:`Transport` gives senders and receivers (for the handoff and throughput scenarios) and
push/pop callables (for the pair scenario); :data:`IMPLS` lists them with the scenario groups they
take part in, so scenarios never branch on an implementation's name.
"""

import importlib
import multiprocessing
import multiprocessing.queues
import queue
import shutil
import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lumenrt.native import RING_KINDS, Ring, RingClosed, make_ring

END = -1
"""Payload of an end-of-stream sentinel; also what a receiver returns for a closed, drained ring."""

RECV_TIMEOUT_S = 5.0  # guessed: far above any latency seen here, short enough to fail fast
SEND_TIMEOUT_S = 30.0  # guessed: a send only waits this long if the consumer died with the ring full
BARRIER_TIMEOUT_S = 30.0  # guessed: covers forking and importing nothing on a loaded 2-core machine
FOREVER_S = 1e6  # faster-fifo wants a number, not None, for "block"
WARMUP_FRACTION = 0.05  # first 5% of handoff samples dropped: thread/process start, first futex waits
RING_CAPACITY = 1024  # guessed: a plausible server queue depth; handoffs never fill it

_I64 = struct.Struct("<q")

# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class Config:
    """Counts and knobs of one run (recorded in the result file)."""

    pair_batch: int
    pair_batches: int
    handoff_n: int
    gap_s: float
    throughput_per_producer: int
    capacity: int = RING_CAPACITY
    quick: bool = False
    scale: float = 1.0
    spin_iters: int = -1  # busy polls of a blocking ring pop/push before sleeping; -1 = ring default

    @classmethod
    def preset(cls, *, quick: bool, scale: float, gap_s: float, spin_iters: int = -1) -> "Config":
        # Counts chosen so the whole run takes ~60-70 s on the 2-core dev machine and --quick ~7 s
        # (measured: a handoff message costs ~0.21 ms there, gap included, and the handoffs are 26
        # of the rows; 2p2c multiprocessing.Queue/faster-fifo move ~250k items/s).
        # pair_batch: 2000 pairs is ~0.1 ms for a ring, long enough to swamp the clock reads.
        if quick:
            batches, handoff_n, per_producer = 40, 1000, 20_000
        else:
            batches, handoff_n, per_producer = 500, 10_000, 200_000

        def scaled(count: int, floor: int) -> int:
            return max(floor, round(count * scale))

        return cls(
            pair_batch=2000,
            pair_batches=scaled(batches, 5),
            handoff_n=scaled(handoff_n, 40),
            gap_s=gap_s,
            throughput_per_producer=scaled(per_producer, 100),
            quick=quick,
            scale=scale,
            spin_iters=spin_iters,
        )


# ---------------------------------------------------------------------------------------------
# Adapters: every implementation seen through the same small interface


class Sender(Protocol):
    """The producing end, made in the producing thread or process."""

    def send(self, seq: int, t0: int) -> None: ...
    def close(self) -> None: ...


class Receiver(Protocol):
    """The consuming end; returns the ``t0`` that was sent, END at end of stream, None on timeout."""

    def recv(self) -> int | None: ...  # blocks (up to the timeout the receiver was made with)
    def poll(self) -> int | None: ...  # never blocks
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PairOps:
    """Bound methods for the ``pair`` loop, called directly so no adapter layer is timed."""

    put: Callable[[int], object]
    get: Callable[[], object]


class Transport:
    """One queue under test, made in the parent before threads start or processes fork."""

    def sender(self) -> Sender:
        raise NotImplementedError

    def receiver(self, timeout_s: float | None) -> Receiver:
        raise NotImplementedError

    def pair_ops(self) -> PairOps:
        raise NotImplementedError

    def finish(self, n_consumers: int) -> None:
        """Tell ``n_consumers`` consumers that no more items come (after all producers are done)."""
        raise NotImplementedError

    def syscalls(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class _RingSender:
    __slots__ = ("_push",)

    def __init__(self, ring: Ring) -> None:
        self._push = ring.push

    def send(self, seq: int, t0: int) -> None:
        if not self._push(seq, t_ns=t0, timeout_s=SEND_TIMEOUT_S):
            raise TimeoutError(f"ring push: no room for {SEND_TIMEOUT_S} s")

    def close(self) -> None:
        pass


class _RingReceiver:
    __slots__ = ("_pop", "_timeout_s", "_try_pop")

    def __init__(self, ring: Ring, timeout_s: float | None) -> None:
        self._pop = ring.pop
        self._try_pop = ring.try_pop
        self._timeout_s = timeout_s

    def recv(self) -> int | None:
        try:
            item = self._pop(self._timeout_s)
        except RingClosed:
            return END
        return None if item is None else item.t_ns

    def poll(self) -> int | None:
        try:
            item = self._try_pop()
        except RingClosed:
            return END
        return None if item is None else item.t_ns

    def close(self) -> None:
        pass


class RingTransport(Transport):
    """A native ring (push(seq, t_ns=t0) / pop().t_ns) in an anonymous shared region."""

    def __init__(self, kind: str, capacity: int, spin_iters: int = -1) -> None:
        self.ring = make_ring(kind, capacity, spin_iters=spin_iters)

    def sender(self) -> Sender:
        return _RingSender(self.ring)

    def receiver(self, timeout_s: float | None) -> Receiver:
        return _RingReceiver(self.ring, timeout_s)

    def pair_ops(self) -> PairOps:
        return PairOps(put=self.ring.push, get=self.ring.pop)

    def finish(self, n_consumers: int) -> None:
        self.ring.close()

    def syscalls(self) -> int | None:
        stats = self.ring.stats()
        return int(stats["futex_waits"]) + int(stats["futex_wakes"])


class _QueueLike(Protocol):
    def put(self, item: int, /) -> None: ...
    def get(self, block: bool = ..., timeout: float | None = ..., /) -> int: ...
    def get_nowait(self) -> int: ...


class _QueueSender:
    __slots__ = ("_put",)

    def __init__(self, q: _QueueLike) -> None:
        self._put = q.put

    def send(self, seq: int, t0: int) -> None:
        self._put(t0)

    def close(self) -> None:
        pass


class _QueueReceiver:
    __slots__ = ("_get", "_get_nowait", "_timeout_s")

    def __init__(self, q: _QueueLike, timeout_s: float | None) -> None:
        self._get = q.get
        self._get_nowait = q.get_nowait
        self._timeout_s = timeout_s

    def recv(self) -> int | None:
        try:
            return self._get(True, self._timeout_s)
        except queue.Empty:
            return None

    def poll(self) -> int | None:
        try:
            return self._get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        pass


class QueueTransport(Transport):
    """Anything with put(x) / get(block, timeout) / get_nowait() raising queue.Empty."""

    def __init__(
        self,
        q: _QueueLike,
        *,
        no_timeout: float | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.q = q
        self._no_timeout = no_timeout  # what "wait forever" is spelled as for this queue
        self._on_close = on_close

    def sender(self) -> Sender:
        return _QueueSender(self.q)

    def receiver(self, timeout_s: float | None) -> Receiver:
        return _QueueReceiver(self.q, self._no_timeout if timeout_s is None else timeout_s)

    def pair_ops(self) -> PairOps:
        return PairOps(put=self.q.put, get=self.q.get)

    def finish(self, n_consumers: int) -> None:
        for _ in range(n_consumers):
            self.q.put(END)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()


def _mp_queue() -> QueueTransport:
    q: multiprocessing.queues.Queue[int] = multiprocessing.get_context("fork").Queue()

    def close() -> None:
        q.close()
        q.cancel_join_thread()  # the parent only ever put sentinels; never wait on a dead reader

    return QueueTransport(q, on_close=close)


def _faster_fifo_queue() -> QueueTransport:
    ff = importlib.import_module("faster_fifo")
    q: _QueueLike = ff.Queue()  # defaults: 1 MB buffer, put() waits up to 10 s for room
    return QueueTransport(q, no_timeout=FOREVER_S)


class _ZmqSender:
    __slots__ = ("_ctx", "_send", "_sock")

    def __init__(self, zmq: Any, address: str) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.connect(address)
        self._send = self._sock.send

    def send(self, seq: int, t0: int) -> None:
        self._send(_I64.pack(t0))

    def close(self) -> None:
        self._sock.close(linger=2000)  # ms; guessed: enough to deliver the last queued messages
        self._ctx.term()


class _ZmqReceiver:
    __slots__ = ("_again", "_ctx", "_noblock", "_recv", "_sock")

    def __init__(self, zmq: Any, address: str, timeout_s: float | None) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        if timeout_s is not None:
            self._sock.setsockopt(zmq.RCVTIMEO, round(timeout_s * 1000))
        self._sock.bind(address)
        self._recv = self._sock.recv
        self._noblock: int = zmq.NOBLOCK
        self._again: type[Exception] = zmq.Again

    def recv(self) -> int | None:
        try:
            data = self._recv()
        except self._again:
            return None
        t0: int = _I64.unpack(data)[0]
        return t0

    def poll(self) -> int | None:
        try:
            data = self._recv(self._noblock)
        except self._again:
            return None
        t0: int = _I64.unpack(data)[0]
        return t0

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


class ZmqTransport(Transport):
    """pyzmq PUSH/PULL over ipc:// in a temporary directory; sockets made after fork, per process."""

    def __init__(self) -> None:
        self._zmq = importlib.import_module("zmq")
        self._dir = tempfile.mkdtemp(prefix="lumenrt-bench-zmq-")
        self._address = f"ipc://{self._dir}/q"

    def sender(self) -> Sender:
        return _ZmqSender(self._zmq, self._address)

    def receiver(self, timeout_s: float | None) -> Receiver:
        return _ZmqReceiver(self._zmq, self._address, timeout_s)

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Registry

PAIR, THREAD, PROCESS, THROUGHPUT = "pair", "thread", "process", "throughput"


@dataclass(frozen=True, slots=True)
class Impl:
    """One implementation: how to make it, which scenario groups it takes part in."""

    name: str
    make: Callable[[Config], Transport]
    groups: frozenset[str]
    requires: str | None = None  # optional module; the impl is skipped with a note without it
    not_in: Mapping[str, str] = field(default_factory=dict)  # group -> why it is left out


def _ring_impl(kind: str) -> Impl:
    if kind == "spsc":
        return Impl(
            kind,
            lambda cfg: RingTransport(kind, cfg.capacity, cfg.spin_iters),
            frozenset({PAIR, THREAD, PROCESS}),
            not_in={THROUGHPUT: "spsc allows one producer and one consumer"},
        )
    return Impl(
        kind,
        lambda cfg: RingTransport(kind, cfg.capacity, cfg.spin_iters),
        frozenset({PAIR, THREAD, PROCESS, THROUGHPUT}),
    )


IMPLS: tuple[Impl, ...] = (
    *(_ring_impl(kind) for kind in RING_KINDS),
    Impl("queue.Queue", lambda cfg: QueueTransport(queue.Queue()), frozenset({PAIR, THREAD})),
    Impl("queue.SimpleQueue", lambda cfg: QueueTransport(queue.SimpleQueue()), frozenset({PAIR, THREAD})),
    Impl("multiprocessing.Queue", lambda cfg: _mp_queue(), frozenset({PROCESS, THROUGHPUT})),
    Impl(
        "faster-fifo",
        lambda cfg: _faster_fifo_queue(),
        frozenset({PROCESS, THROUGHPUT}),
        requires="faster_fifo",
    ),
    Impl("pyzmq-ipc", lambda cfg: ZmqTransport(), frozenset({PROCESS}), requires="zmq"),
)
