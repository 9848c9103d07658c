"""PyTorch's pool threads run where the plan puts the worker (issue 38), read back from
``/proc/<pid>/task/<tid>/status`` in both worker modes: every thread torch starts for a pinned
worker (its intra-op pool, started by the worker's first parallel operation) may run on the
worker's planned CPUs and no others.

The model's config puts its one instance on CPU 1 (``instance_group.cores``), which is what the
plan gives it. A plan gives a worker one compute thread per CPU, so on a 2-CPU machine a worker
with a pool (2 threads) has both CPUs, which every thread may use anyway: a misplaced thread could
not be told apart. The test therefore raises that worker's thread count to 2 in the plan (as a
bigger host's plan gives a worker two of its CPUs), keeping its CPU: torch's pool then has a
thread besides the worker's, and it must be on CPU 1 only, not on every CPU.

In process mode every thread of the worker process counts, numpy's OpenBLAS pool too: the process
starts it when it imports numpy, before it pins itself, so the pool starts the child onto its CPUs
at birth (``ProcessPool._spawn``); before that, the pool's threads ran on every CPU."""

import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

import lumenrt.engine.engine as engine_module
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.placing import placements_of, plan_engine
from lumenrt.placement.plan import Plan

MODEL = "torch_wide"
CPU = 1  # the worker's CPU: not every CPU of this machine
ELEMENTS = 1 << 18  # torch splits an element-wise op over its threads from 32768 elements on


class Wide(torch.nn.Module):
    """y = 2x, after an element-wise pass over a buffer large enough for torch to run it on its
    intra-op pool (exp(0) summed over the buffer, less its size: zero)."""

    big: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("big", torch.zeros(ELEMENTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zero = torch.exp(self.big).sum() - self.big.numel()
        return x * 2 + zero


def cpus_of(pid: int) -> dict[int, set[int]]:
    """Thread id -> the CPUs it may run on."""
    out: dict[int, set[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)
        assert m is not None
        cpus: set[int] = set()
        for part in m.group(1).split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        out[int(task.name)] = cpus
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-repo")
    (root / MODEL / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.script(Wide()).save(str(root / MODEL / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    config = {
        "backend": "pytorch",
        "max_batch_size": 1,
        "input": [{"name": "x", "datatype": "FP32", "dims": [4]}],
        "output": [{"name": "y", "datatype": "FP32", "dims": [4]}],
        "instance_group": {"count": 1, "cores": [CPU]},
    }
    (root / MODEL / "config.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture
def two_threads_on_its_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The engine's plan, with the model's worker given 2 compute threads on its one CPU."""

    def planned(*args: Any, **kwargs: Any) -> Plan:
        plan = plan_engine(*args, **kwargs)
        models = tuple(
            replace(m, workers=tuple(replace(w, threads=2) for w in m.workers)) if m.model == MODEL else m
            for m in plan.models
        )
        return replace(plan, models=models)

    monkeypatch.setattr(engine_module, "plan_engine", planned)
    yield


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_torchs_pool_threads_run_on_the_workers_planned_cpu(
    repo: Path, mode: str, two_threads_on_its_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if CPU not in os.sched_getaffinity(0) or len(os.sched_getaffinity(0)) < 2:
        pytest.skip(f"needs CPU {CPU} and another one")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)  # numpy's pool starts: it must be placed too
    before = set(cpus_of(os.getpid()))
    settings = EngineConfig(worker_mode=mode, pin=True, lane="queue")
    with Engine(repo, settings, models=[MODEL]) as engine:
        assert engine.plan is not None
        (placement,) = placements_of(engine.plan, MODEL)
        assert (placement.cores, placement.intra_op_threads) == ((CPU,), 2)
        rt = engine.runtime(MODEL)
        pid = os.getpid() if mode == "thread" else rt.statistics()["pids"][0]
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        np.testing.assert_array_equal(engine.infer(MODEL, {"x": x}).outputs["y"], x * 2)
        threads = cpus_of(pid)
        if mode == "thread":  # the engine's process: the threads the engine started
            mine = {tid: cpus for tid, cpus in threads.items() if tid not in before}
        else:  # the worker's own process: all of its threads, its main thread the worker
            mine = threads
        ((_, worker_tid),) = rt.workers.tasks()
        assert worker_tid in mine and mine[worker_tid] == {CPU}, "the worker is not on its CPU"
        misplaced = {tid: sorted(cpus) for tid, cpus in mine.items() if cpus != {CPU}}
        assert not misplaced, f"threads not on the worker's CPU {CPU}: {misplaced}"
        # torch's pool ran the model's element-wise pass: a thread besides the worker's
        assert len(mine) >= 2, f"torch started no thread for the worker (threads: {threads})"
