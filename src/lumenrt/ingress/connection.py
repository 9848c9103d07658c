"""Connection handling shared by the HTTP and binary TCP front ends: read-side and write-side flow
control, the receive, idle and stalled-client timeouts, and the one sweeper that enforces them.

A front end's protocol class subclasses :class:`Connection` and its listener subclasses
:class:`Listener`. The protocol keeps its parsing and its answers; it tells this module what only
it knows through hooks: whether a request is being served (``_serving``), which message is partly
received (``_partial``), what to send when one times out (``_receive_timed_out``), how to hold and
release input it already has around a read pause (``_hold_input``/``_release_input``), and what to
do once the write buffer drains (``_writes_resumed``), and what an idle connection need not hold
(``_release_idle``). A front end sets ``load_paused`` through
``_pause_for_load``/``_resume_for_load`` at its own limits, and its ``data_received`` begins with
``self.received += 1``.

Invariants
  1. Reading is paused while either of two reasons holds, each its own flag: too many requests in
     flight or queued on the connection (``load_paused``: set and cleared by the front end at its
     own limits) and the transport's write buffer over its high-water mark (``write_paused``:
     asyncio's ``pause_writing`` .. ``resume_writing``). Reading resumes only once neither holds;
     clearing one never undoes the other. ``reading_paused`` is the transport's actual state, so
     a pause or resume reaches the transport once per change, not once per reason.
  2. Once ``closing`` (closed or aborted by us, half-closed after a fatal error, or lost) no answer
     is written and reading is never paused again (a closing connection that must drain its input
     keeps reading: ``_read_while_closing``).
  3. The hot path keeps no time: ``data_received`` bumps ``received`` and a message's start or end
     bumps a protocol counter; no clock is read, no timer armed and nothing allocated per request.
     Clocks are read by the sweeper and on rare events only (a pause, a resume, a close).
  4. One sweeper task per front end walks its live connections every ``sweep_interval_s`` (a
     quarter of the shortest timeout). A timeout's clock starts at the sweep that sees its cause,
     so it fires less than two intervals late (the shortest within 1.25x of itself; less than four
     when a pass is spread over several slices, invariant 5, since a connection's checks are then
     up to two intervals apart). A connection is in ``Listener.connections`` from
     ``connection_made`` to ``connection_lost``.
     ``check_timeouts`` applies the first that matches:
       a. closing, its last answers still buffered: aborted when the buffer did not shrink for
          ``idle_timeout_s`` (the client never reads them);
       b. writes paused: aborted, buffered and queued answers dropped, when the buffer did not
          shrink for ``idle_timeout_s`` while nothing was being served: the client stopped
          reading. A slow reader shrinks it between sweeps and is left alone;
       c. reading paused for load: no clock runs (the server is the one waiting);
       d. a message partly received: the protocol's receive-timeout answer once the same message
          is still incomplete ``receive_timeout_s`` after the first sweep (or read resume) that saw
          it. The receive clock stops while reading is paused and restarts when it resumes;
       e. idle (nothing received, nothing served, nothing partly received) for ``idle_timeout_s``:
          closed gracefully, answers already written flushed first; idle since the sweep before:
          ``_release_idle`` (TCP: its receive buffer goes back).
     Something received, or a request being served, restarts the activity clock at the sweep that
     sees it. A connection found idle (e) is ``quiet``: until it receives something or closes, a
     sweep looks at its idle clock only (nothing else can change while nothing arrives: no request,
     so nothing served, written or partly received).
  5. A pass is spread over the interval: ``SWEEP_SLICE`` connections at a time, evenly spaced, each
     slice reading the clock once, so that the requests never wait for more than one slice
     however many connections are open; each connection is still checked once an interval.
  6. Everything runs on the loop's thread: no locks; the engine calls back through the loop.

Shutdown order (``Listener.close``, after ``ServerApp.shutdown`` stopped accepting requests and
waited up to ``grace_s`` for those in flight):
  1. the listening socket closes: no new connections;
  2. the sweeper task is cancelled and awaited: no timeout fires part way through shutdown;
  3. every connection closes: ``closing`` drops later answers, and the transport closes once
     what is already buffered is flushed;
  4. the listener's ``wait_closed`` is awaited, for at most ``CLOSE_WAIT_S``. Requests still
     queued are finished by the engine; their answers reach closed connections and are dropped.
"""

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from lumenrt.ingress.service import ServeLimits

CLOSE_WAIT_S = 5.0  # shutdown: the most ``close`` waits for the listener to report closed (guessed)
# Connections checked in one go before the sweeper lets the loop run (invariant 5). Measured on this
# 2-core VM with 5,000 idle connections per front end: a whole pass took 7 ms (1.4 us a connection),
# longer than a small model's p99 under load (10,000 connections then missed benchmarks/connections.py's
# p99 bound: 3.8x over HTTP, 1.4x over TCP); a quiet connection is checked in 0.27 us, so a slice
# holds the loop ~0.1 ms.
SWEEP_SLICE = 256


def sweep_interval_s(limits: ServeLimits) -> float:
    """A quarter of the shortest timeout, within 10 ms .. 1 s (guessed): the shortest limit is
    enforced within 1.25x of itself, and a server with long timeouts wakes once a second."""
    return min(1.0, max(0.01, min(limits.receive_timeout_s, limits.idle_timeout_s) / 4))


class Connection(asyncio.BaseProtocol):
    """The flow control and timeouts of one connection (see the module docstring)."""

    # Slots: an idle connection is mostly its attributes, and the front ends' classes add more than
    # the 30 that Python 3.11 keeps compact in an instance dict (HTTP: 1.5 KiB of dict a connection)
    __slots__ = (
        "_buffer_seen",
        "_clock",
        "_counted",
        "_listener",
        "_partial_seen",
        "_partial_since",
        "_received_seen",
        "active_at",
        "closing",
        "limits",
        "load_paused",
        "peer_host",
        "quiet",
        "reading_paused",
        "received",
        "transport",
        "write_paused",
    )

    def __init__(self, listener: "Listener[Any]", limits: ServeLimits) -> None:
        self._listener = listener
        self._clock = listener.clock
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.closing = False  # no answer is written any more (invariant 2)
        self.load_paused = False  # reading paused: too many requests in flight or queued
        self.write_paused = False  # reading paused: the write buffer is over its high-water mark
        self.reading_paused = False  # the transport's reading is paused (by either reason)
        self.received = 0  # chunks received: the hot path's only timekeeping (invariant 3)
        # sweeper bookkeeping
        self.active_at = self._clock()  # when the connection was last seen doing something
        self._received_seen = 0  # ``received`` at the last sweep
        self._buffer_seen = 0  # write buffer size at the last sweep (or pause or close)
        self._partial_seen = -1  # ``_partial()`` when its receive clock started; -1: none
        self._partial_since = 0.0
        self.quiet = False  # idle at a sweep, nothing received since (invariant 4)
        self.peer_host = ""  # the client's address (connections per client; rate limits)
        self._counted = False  # counted in the listener's per-client table

    # ---- hooks --------------------------------------------------------------------------------

    def _serving(self) -> bool:
        """A request of this connection is in the engine or being answered: not idle."""
        raise NotImplementedError

    def _partial(self) -> int:
        """-1 when no message is partly received, else a number that stays the same while one
        message arrives and changes once it is whole (a count of messages begun or delivered)."""
        raise NotImplementedError

    def _receive_timed_out(self) -> None:
        """A message was not received whole within ``receive_timeout_s``: answer and close."""
        raise NotImplementedError

    def _hold_input(self) -> None:
        """Reading pauses: stop delivering input already received (TCP: its frame decoder)."""

    def _release_input(self) -> None:
        """Reading resumed: deliver what was held (it may pause reading again)."""

    def _writes_resumed(self) -> None:
        """The write buffer drained under its low-water mark (HTTP: go on with queued requests)."""

    def _release_idle(self) -> None:
        """Nothing received, served or partly received since the last sweep: give back what an
        idle connection need not hold (TCP: its own receive buffer)."""

    # ---- asyncio.BaseProtocol------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer_host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        limit = self.limits.max_connections_per_client
        if limit:
            counts = self._listener.per_client
            open_now = counts.get(self.peer_host, 0)
            if open_now >= limit:  # refused at once: never served, never swept
                self.closing = True
                self._refuse(f"too many connections from {self.peer_host}: the limit is {limit} per client")
                self.transport.close()
                return
            counts[self.peer_host] = open_now + 1
            self._counted = True
        self._listener.connections.add(self)

    def _refuse(self, message: str) -> None:
        """A connection over the per-client limit: what to write before it is closed (hook)."""

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._listener.connections.discard(self)
        if self._counted:  # the table holds only addresses with open connections
            self._counted = False
            counts = self._listener.per_client
            left = counts.get(self.peer_host, 1) - 1
            if left > 0:
                counts[self.peer_host] = left
            else:
                counts.pop(self.peer_host, None)

    def pause_writing(self) -> None:
        """The write buffer is over its high-water mark: read nothing more until it drains."""
        self.write_paused = True
        self.active_at = self._clock()  # the stall clock (check_timeouts) starts here
        if self.transport is not None:
            self._buffer_seen = self.transport.get_write_buffer_size()
        self._pause_reading()

    def resume_writing(self) -> None:
        """The buffer drained under its low-water mark: the protocol goes on (which may fill it
        again), then reading resumes unless the load still holds it paused."""
        self.write_paused = False
        self.active_at = self._clock()
        self._writes_resumed()
        self._resume_reading()

    # ---- flow control (for the front ends) -----------------------------------------------------

    def _pause_for_load(self) -> None:
        self.load_paused = True
        self._pause_reading()

    def _resume_for_load(self) -> None:
        self.load_paused = False
        self._resume_reading()

    def _pause_reading(self) -> None:
        transport = self.transport
        if self.reading_paused or self.closing or transport is None:
            return
        self.reading_paused = True
        self._hold_input()
        if not transport.is_closing():
            transport.pause_reading()

    def _resume_reading(self) -> None:
        """Read again once neither reason holds. A message that was arriving when reading paused
        gets its receive clock restarted: the wait was the server's, not the client's."""
        transport = self.transport
        if not self.reading_paused or self.load_paused or self.write_paused or self.closing:
            return
        if transport is None or transport.is_closing():
            return
        self.reading_paused = False
        transport.resume_reading()
        self._release_input()
        partial = self._partial()
        if partial >= 0 and not self.reading_paused:
            self._partial_seen = partial
            self._partial_since = self._clock()

    def _read_while_closing(self) -> None:
        """A closing connection that drains its input (so that closing does not reset it) reads
        whatever held reading paused; nothing pauses it again (invariant 2)."""
        transport = self.transport
        if self.reading_paused and transport is not None and not transport.is_closing():
            self.reading_paused = False
            transport.resume_reading()

    # ---- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop answering; the transport closes once what is buffered is flushed (the sweeper
        aborts it if the client does not read that within ``idle_timeout_s``)."""
        if self.closing or self.transport is None:
            return
        self.closing = True
        self._close_transport()

    def _close_transport(self) -> None:
        transport = self.transport
        if transport is None:
            return
        self.active_at = self._clock()  # the flush clock (check_timeouts) starts here
        self._buffer_seen = transport.get_write_buffer_size()
        transport.close()

    def abort(self) -> None:
        """Drop the connection now, with every answer buffered or owed."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    # ---- the sweeper's check ------------------------------------------------------------------

    def check_timeouts(self, now: float) -> None:
        """Invariant 4: ``now`` is the listener's clock, read once per sweep."""
        transport = self.transport
        if transport is None:
            return
        if self.quiet:  # the common case with many connections: a few comparisons
            if (
                self.received == self._received_seen
                and not self.closing
                and now - self.active_at < self.limits.idle_timeout_s
            ):
                return
            self.quiet = False
        if self.closing:
            self._check_closing(now, transport)
            return
        if self.received != self._received_seen:
            self._received_seen = self.received
            self.active_at = now
        serving = self._serving()
        if serving:
            self.active_at = now  # the idle clock starts after the request
        if self.write_paused:
            if self._write_stalled(now, transport):
                # abort, since close() would keep the buffer until a client that does not read
                # has read it
                self.abort()
            return
        if self.load_paused:
            return
        partial = self._partial()
        if partial >= 0:
            if partial != self._partial_seen:
                self._partial_seen = partial
                self._partial_since = now
            elif now - self._partial_since >= self.limits.receive_timeout_s:
                self._receive_timed_out()
            return
        self._partial_seen = -1
        if serving:
            return
        if now - self.active_at >= self.limits.idle_timeout_s:
            self.close()
        elif self.active_at != now:  # nothing since the sweep before
            self._release_idle()
            self.quiet = True

    def _check_closing(self, now: float, transport: asyncio.Transport) -> None:
        """Invariant 4a: closed by us, its last answers being flushed (TCP first lingers after a
        fatal error)."""
        if self._write_stalled(now, transport):
            self.abort()

    def _write_stalled(self, now: float, transport: asyncio.Transport) -> bool:
        """True when bytes are buffered and the client read none of them for ``idle_timeout_s``."""
        size = transport.get_write_buffer_size()
        if size < self._buffer_seen:
            self.active_at = now  # the client reads, if slowly
        self._buffer_seen = size
        return size > 0 and now - self.active_at >= self.limits.idle_timeout_s


C = TypeVar("C", bound=Connection)


class Listener(Generic[C]):
    """A front end's listening socket, its live connections, and their sweeper."""

    def __init__(self, limits: ServeLimits) -> None:
        self.limits = limits
        self.port = 0
        self.connections: set[C] = set()
        self.per_client: dict[str, int] = {}  # address -> open connections (only those with some)
        self.sweep_interval_s = sweep_interval_s(limits)
        self.clock: Callable[[], float] = time.monotonic  # tests drive a fake one
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def _connection(self) -> C:
        """A protocol instance for a new connection."""
        raise NotImplementedError

    async def listen(self, host: str, port: int, ssl: Any = None) -> None:
        """Listen on ``host:port`` (0: any free port; see ``.port``) and start the sweeper.
        ``ssl``: an ``ssl.SSLContext`` for TLS (ingress/tls.py); a handshake must end within
        ``receive_timeout_s`` (a connection exists for this module only once it has)."""
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if ssl is not None:
            tls = {"ssl": ssl, "ssl_handshake_timeout": min(60.0, self.limits.receive_timeout_s)}
        self._server = await loop.create_server(
            self._connection, host, port, reuse_address=True, backlog=1024, **tls
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._sweeper = loop.create_task(self._sweep_forever())

    def sweep(self, now: float) -> None:
        for conn in list(self.connections):
            conn.check_timeouts(now)

    async def _sweep_forever(self) -> None:
        """Invariants 4 and 5: a pass every ``sweep_interval_s``, in slices spread over it."""
        connections = self.connections
        while True:
            snapshot = list(connections)
            slices = max(1, -(-len(snapshot) // SWEEP_SLICE))
            for at in range(slices):
                await asyncio.sleep(self.sweep_interval_s / slices)
                now = self.clock()
                for conn in snapshot[at * SWEEP_SLICE : (at + 1) * SWEEP_SLICE]:
                    if conn in connections:  # not lost since the pass began
                        conn.check_timeouts(now)

    async def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """The shutdown order in the module docstring."""
        await self.stop_listening()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), CLOSE_WAIT_S)
