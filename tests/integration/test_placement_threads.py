"""A worker's backend threads run on all of its cores (engine.placements_for, #15): ONNX Runtime's
intra-op pool is started by the pinned worker and inherits its affinity, so a worker with two
compute threads must be pinned to two cores, or both threads share one. Read back from
``/proc/<pid>/task/*/status``, in both worker modes, on this machine's cores."""

import os
import re
from pathlib import Path

import pytest

from lumenrt.engine.engine import Engine, placements_for
from lumenrt.engine.server_config import EngineConfig
from lumenrt.models.builtin import builtin_examples

MODEL = "digits_mlp"


def thread_affinities(pid: int) -> dict[int, set[int]]:
    """Thread id -> the CPUs it may run on."""
    out: dict[int, set[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)
        assert m is not None
        cpus: set[int] = set()
        for part in m.group(1).split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        out[int(task.name)] = cpus
    return out


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_workers_compute_threads_are_not_crowded_onto_one_core(mode: str) -> None:
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    (placement,) = placements_for(1, cores)
    assert placement.intra_op_threads == len(cores)  # one worker: a compute thread per core
    before = set(thread_affinities(os.getpid()))
    settings = EngineConfig(worker_mode=mode, thread_count=1, pin=True, lane="queue")
    with Engine(models=[MODEL], settings=settings) as engine:
        engine.infer(MODEL, builtin_examples(MODEL, 1))  # the worker's session has run
        if mode == "thread":
            threads = {t: a for t, a in thread_affinities(os.getpid()).items() if t not in before}
        else:
            (pid,) = engine.runtime(MODEL).statistics()["pids"]
            threads = thread_affinities(pid)
        assert len(threads) >= 2  # the worker and its session's pool thread at least
        threads_per_worker = placement.intra_op_threads  # its session's compute threads
        crowded = {t: sorted(a) for t, a in threads.items() if len(a) < threads_per_worker}
        assert crowded == {}, f"threads confined to fewer than the worker's {threads_per_worker} cores"
