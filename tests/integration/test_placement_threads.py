"""A worker's compute threads run one to each of its planned cores (#15), read back from
``/proc/<pid>/task/*/status`` in both worker modes on this machine's cores: ONNX Runtime's intra-op
pool threads on the cores after the worker's first (``session.intra_op_thread_affinities``), and
the worker, pinned to all of them while its session starts, narrowed to its first once it has."""

import os
import re
from pathlib import Path

import pytest

from lumenrt.engine.engine import Engine
from lumenrt.engine.placing import placements_of
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


@pytest.mark.parametrize("placement_policy", ["spread", "roundrobin"])
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_workers_compute_threads_run_one_to_a_planned_core(mode: str, placement_policy: str) -> None:
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    before = set(thread_affinities(os.getpid()))
    settings = EngineConfig(worker_mode=mode, pin=True, lane="queue", placement=placement_policy)
    with Engine(models=[MODEL], settings=settings) as engine:
        assert engine.plan is not None
        (placement,) = placements_of(engine.plan, MODEL)
        # one model with one instance (its config's count): a compute thread per core, all of them
        assert (placement.cores, placement.intra_op_threads) == (cores, len(cores))
        engine.infer(MODEL, builtin_examples(MODEL, 1))  # the worker's session has run
        if mode == "thread":
            threads = {t: a for t, a in thread_affinities(os.getpid()).items() if t not in before}
        else:
            (pid,) = engine.runtime(MODEL).statistics()["pids"]
            threads = thread_affinities(pid)
        # the worker on its first core, its pool's threads one to each of the others: no two of its
        # compute threads share a core
        pinned = sorted(sorted(a) for a in threads.values() if len(a) == 1)
        assert pinned == [[c] for c in cores], f"compute threads not one to each of {cores}: {threads}"
