"""The eventfd notifier wakes a real asyncio loop (loop.add_reader) only when it is armed."""

import asyncio
import threading

from lumenrt.native import NOTIFIER_BYTES, Layout, Notifier, Region, Ring, ring_required_bytes


def test_worker_thread_wakes_asyncio_loop_and_nothing_is_lost() -> None:
    lay = Layout()
    ring_at = lay.add(ring_required_bytes(1024))
    note_at = lay.add(NOTIFIER_BYTES)
    region = Region.anonymous(lay.size_bytes)
    ring = Ring.create(region, "mpmc", 1024, offset=ring_at)
    notifier = Notifier.create(region, offset=note_at)
    n_items = 5000

    def worker() -> None:
        for i in range(n_items):
            ring.push(i)
            notifier.notify()

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        received: list[int] = []
        done = loop.create_future()

        def on_readable() -> None:
            notifier.drain()
            while True:
                for item in ring.pop_many(256, timeout_s=0):
                    received.append(item.request_id)
                if len(received) == n_items:
                    if not done.done():
                        done.set_result(None)
                    return
                notifier.arm()
                if len(ring) == 0:  # re-check after arming (see notifier.h)
                    return

        loop.add_reader(notifier.fileno(), on_readable)
        notifier.arm()
        t = threading.Thread(target=worker)
        t.start()
        await asyncio.wait_for(done, 60)
        loop.remove_reader(notifier.fileno())
        t.join()
        return received

    received = asyncio.run(main())
    assert received == list(range(n_items))
    stats = notifier.stats()
    assert stats["notify_calls"] == n_items
    # a write happens only for an arm (the loop was asleep); never one per notify by construction
    assert 1 <= stats["writes"] <= stats["arms"]


def test_notify_without_arm_makes_no_system_call() -> None:
    region = Region.anonymous(NOTIFIER_BYTES)
    notifier = Notifier.create(region)
    assert not any(notifier.notify() for _ in range(1000))
    assert notifier.stats() == {"notify_calls": 1000, "writes": 0, "arms": 0}
    notifier.arm()
    assert notifier.notify() is True
    assert notifier.drain() == 1
    other = Notifier.attach(region, notifier.fileno())
    notifier.arm()
    assert other.notify() is True
    assert notifier.drain() == 1
