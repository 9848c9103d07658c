"""Adaptive batching (engine.batching, engine/batch_cost.py) through a real engine, in both worker
modes: one test body, the same requests, two Python models whose time depends on the batch's rows
the way measured models' does, with wide margins. ``dear`` takes 2 ms alone and 6 ms a row in any
batch (batching costs, as SqueezeNet's did on this VM at times); ``cheap`` takes 10 ms plus 0.5 ms
a row (batching pays). Each run sends 8 requests one at a time (a model in service), then queues
200 one-row requests at once on one worker, so the batcher could always form batches of 8; what
it formed is read from the statistics (``batch_rows``). The exact rules are the scripted unit
tests' (tests/unit/test_batch_cost.py); these check that both pools apply them to real batches.
A delay the machine adds to a batch (a busy CI runner) makes single requests look dearer a row,
so the margins are wide: 3x a row for ``dear``, 6x for ``cheap``."""

import asyncio
from pathlib import Path

import numpy as np
import pytest

from lumenrt.engine.engine import Engine, EngineConfig

MODEL_PY = """
import time


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        rows = len(inputs["x"])
        time.sleep({cost})
        return {{"y": inputs["x"] * 2}}
"""
COSTS = {
    "dear": "0.002 if rows == 1 else 0.006 * rows",
    "cheap": "0.010 + 0.0005 * rows",
}
REQUESTS = 200
WARM = 8


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adaptive")
    for name, cost in COSTS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY.format(cost=cost))
        (root / name / "config.yaml").write_text(
            "backend: python\nmax_batch_size: 8\ndynamic_batching: {max_queue_delay_us: 0}\n"
            "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
            "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
            "instance_group: {count: 1}\n"
        )
    return root


@pytest.fixture(scope="module", params=["thread", "process"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(repo: Path, mode: str, batching: str, model: str) -> dict[int, int]:
    """Queue REQUESTS one-row requests at once; every answer checked; the batch sizes that ran."""
    settings = EngineConfig(worker_mode=mode, batching=batching, lane="queue", pin=False)

    async def all_at_once(engine: Engine) -> None:
        for _ in range(WARM):  # a model in service: its first (cold) calls are behind it
            await engine.infer_async(model, {"x": np.zeros((1, 2), dtype=np.float32)})
        xs = [np.full((1, 2), i, dtype=np.float32) for i in range(REQUESTS)]
        results = await asyncio.gather(*(engine.infer_async(model, {"x": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result.outputs["y"], x * 2)

    with Engine(repo, settings, models=[model]) as engine:
        asyncio.run(all_at_once(engine))
        stats = engine.runtime(model).statistics()
    assert stats["batching"] == batching
    rows = {int(k): int(v) for k, v in stats["batch_rows"].items()}
    assert sum(size * n for size, n in rows.items()) == WARM + REQUESTS  # every request ran, once
    return rows


def in_batches_over(rows: dict[int, int], size: int) -> int:
    """Requests that ran in batches of more than ``size`` rows."""
    return sum(s * n for s, n in rows.items() if s > size)


def test_fixed_batching_forms_big_batches_whatever_they_cost(repo: Path, mode: str) -> None:
    for model in COSTS:
        assert in_batches_over(run(repo, mode, "fixed", model), 4) > REQUESTS // 2


def test_adaptive_batching_runs_single_requests_where_batching_costs(repo: Path, mode: str) -> None:
    rows = run(repo, mode, "adaptive", "dear")
    assert in_batches_over(rows, 1) >= 1  # an upward probe ran (one in 32 batches)...
    assert rows.get(1, 0) >= (WARM + REQUESTS) * 3 // 4  # ...and was not taken up


def test_adaptive_batching_forms_big_batches_where_batching_pays(repo: Path, mode: str) -> None:
    rows = run(repo, mode, "adaptive", "cheap")
    assert in_batches_over(rows, 4) > REQUESTS // 2
