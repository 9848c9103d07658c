"""Busy-polling the event loop for a while after each request and answer (``loop_spin_us``).

An event loop that goes to sleep in ``epoll_wait`` between two requests of a closed-loop client
is woken by the next one; on a virtual machine the CPU it ran on may have halted meanwhile, and
waking it costs tens of microseconds (on the 2-CPU VM, digits_mlp at one client over TCP: p50
187 µs asleep against 138 µs kept awake, benchmarks/latency.py; README ``loop_spin_us``). While
the spinner is on, a callback re-queues itself on every turn of the loop, so the loop polls its
sockets with a zero timeout instead of sleeping, and a request that arrives is read at once. The
window opens again with every request (the service's ``infer_inline``) and every answer a worker
sends back (``_answered``): a request to a model slower than the window would otherwise find the
loop asleep when its answer goes out, and so would the client's next request.

Invariants
  1. Event loop thread only: ``seen`` (called by the service for every request and every answer
     from the workers) and the spin callback run there; no lock.
  2. Bounded: the spin stops once ``window_ns`` passed without a request or an answer, so an
     idle server polls for at most that long after its last one and then sleeps as before; it
     starts again with the next request. With ``window_ns`` 0 nothing is ever scheduled.
  3. Cheap while busy: ``seen`` is a counter increment and a flag test; the clock is read only in
     the spin callback, once a turn.
  4. One callback at most: ``spinning`` is true exactly while one spin callback is queued, so
     requests never stack callbacks.
"""

import asyncio
import time


class LoopSpinner:
    __slots__ = ("_deadline_ns", "_last_count", "_loop", "count", "spinning", "turns", "window_ns")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int) -> None:
        self._loop = loop
        self.window_ns = window_us * 1000
        self.count = 0  # requests and answers seen
        self._last_count = 0  # ... at the last spin turn
        self._deadline_ns = 0
        self.spinning = False
        self.turns = 0  # spin turns run (the statistics: how much polling it cost)

    def seen(self) -> None:
        """A request arrived or an answer went out (invariant 3): keep the loop awake for
        ``window_ns`` more."""
        self.count += 1
        if not self.spinning and self.window_ns:
            self.spinning = True
            self._last_count = self.count - 1  # the first turn sees a new request: the window opens
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        now = time.monotonic_ns()
        self.turns += 1
        if self.count != self._last_count:
            self._last_count = self.count
            self._deadline_ns = now + self.window_ns
        if now < self._deadline_ns:
            self._loop.call_soon(self._spin)
        else:
            self.spinning = False
