"""``lumenrt demo``: the native core end to end, until the server exists.

The parent plays the ingress: it copies each request's tensor once into a slab slot of a named
shared-memory segment and pushes a descriptor to the request ring; worker processes (one per core)
pop descriptors, read the tensor in place (a numpy view, no copy), write the answer into the same
slot and push the descriptor to the completion ring; the parent reads the answer and frees the slot.
"""

import multiprocessing
import os
import time

import numpy as np

from lumenrt.native import (
    MAX_AGENTS,
    Layout,
    Region,
    Ring,
    RingClosed,
    SlabPool,
    agent_table,
    clean_stale,
    create_shared,
    leftover_segments,
    ring_required_bytes,
    slab_required_bytes,
)

VECTOR_LEN = 256  # floats per request: a small feature vector (guessed, typical of tabular models)
SLOT_BYTES = VECTOR_LEN * 4
IN_FLIGHT = 64  # requests outstanding at once (closed loop)


def _worker(name: str, offsets: dict[str, int]) -> None:
    region = Region.attach_shm(name)
    requests = Ring.attach(region, offsets["requests"])
    completions = Ring.attach(region, offsets["completions"])
    pool = SlabPool.attach(region, offsets["pool"])
    weights = np.linspace(-1.0, 1.0, VECTOR_LEN, dtype=np.float32)
    while True:
        try:
            item = requests.pop()
        except RingClosed:
            return
        assert item is not None
        x = np.frombuffer(pool.view(item.slot), dtype=np.float32)  # in place: no copy
        x[0] = float(x @ weights)  # the "model": a dot product, answer written into the slot
        completions.push(item.request_id, slot=item.slot, nbytes=4, t_ns=item.t_ns)


def run_demo(requests: int = 20000, workers: int = 2, queue_type: str = "mpmc") -> int:
    if requests <= 0 or workers <= 0:
        raise SystemExit("lumenrt demo: --requests and --workers must be > 0")
    if workers >= MAX_AGENTS:  # each ring: the workers and this process's thread
        raise SystemExit(f"lumenrt demo: --workers must be < {MAX_AGENTS} (a ring's largest agent table)")
    agents = agent_table(workers + 1)
    removed = clean_stale()
    if removed:
        print(f"removed {len(removed)} stale shared-memory segment(s) from a crashed run")
    lay = Layout()
    offsets = {
        "requests": lay.add(ring_required_bytes(1024, agents)),
        "completions": lay.add(ring_required_bytes(1024, agents)),
        "pool": lay.add(slab_required_bytes(SLOT_BYTES, IN_FLIGHT), align=4096),
    }
    region = create_shared(lay.size_bytes, tag="demo")
    req_ring = Ring.create(region, queue_type, 1024, offset=offsets["requests"], max_agents=agents)
    done_ring = Ring.create(region, "mpmc", 1024, offset=offsets["completions"], max_agents=agents)
    pool = SlabPool.create(region, SLOT_BYTES, IN_FLIGHT, offset=offsets["pool"])
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(region.name, offsets), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    print(
        f"lumenrt demo: {workers} worker processes, request ring {queue_type}, "
        f"segment /dev/shm/{region.name} ({lay.size_bytes} bytes)"
    )
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((IN_FLIGHT, VECTOR_LEN), dtype=np.float32)
    weights = np.linspace(-1.0, 1.0, VECTOR_LEN, dtype=np.float32)
    latencies_ns = np.empty(requests, dtype=np.int64)
    sent = received = wrong = 0
    t_start = time.perf_counter_ns()
    while received < requests:
        while sent < requests and sent - received < IN_FLIGHT:
            slot = pool.alloc()
            np.frombuffer(pool.view(slot), dtype=np.float32)[:] = inputs[sent % IN_FLIGHT]  # the one copy
            req_ring.push(sent, slot=slot, nbytes=SLOT_BYTES, t_ns=time.perf_counter_ns())
            sent += 1
        item = done_ring.pop(timeout_s=30)
        if item is None:
            print("no answer within 30 s: a worker died?")
            break
        latencies_ns[received] = time.perf_counter_ns() - item.t_ns
        answer = float(np.frombuffer(pool.view(item.slot), dtype=np.float32)[0])
        want = float(inputs[item.request_id % IN_FLIGHT] @ weights)
        wrong += not np.isclose(answer, want, rtol=1e-4, atol=1e-4)
        pool.free(item.slot)
        received += 1
    elapsed_s = (time.perf_counter_ns() - t_start) / 1e9
    req_ring.close()
    for p in procs:
        p.join(10)
    lat_us = latencies_ns[:received] / 1000
    stats = pool.stats()
    print(
        f"{received}/{requests} answered, {wrong} wrong, {received / elapsed_s:,.0f} req/s; "
        f"round trip p50 {np.percentile(lat_us, 50):.1f} us, p99 {np.percentile(lat_us, 99):.1f} us "
        f"({IN_FLIGHT} in flight)"
    )
    print(
        f"arena: {stats['allocated']} allocated, {stats['freed']} freed, high water "
        f"{stats['high_water']}/{stats['n_slots']} slots; request ring {req_ring.stats()['futex_wakes']} wake-ups"
    )
    name = region.name
    del req_ring, done_ring, pool
    region.close()
    left = [n for n in leftover_segments() if n == name]
    print("shared memory cleaned up" if not left else f"LEFT BEHIND: {left}")
    ok = received == requests and wrong == 0 and stats["in_use"] == 0 and not left
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_demo(workers=os.cpu_count() or 1))
