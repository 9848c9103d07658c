"""Adaptive batching (engine.batching, engine/batch_cost.py) through a real engine, in both worker
modes: one test body, the same requests, two Python models whose time depends on the batch's rows
the way measured models' does. ``dear`` takes 2 ms alone and 3 ms a row in any batch (SqueezeNet in
the server: batching costs); ``cheap`` takes 4 ms plus 1 ms a row (batching pays).
Each run sends 8 requests one at a time (a model in service), then queues 96 one-row requests at
once on one worker, so the batcher could always form
batches of 8; what it formed is read from the statistics (``batch_rows``). The margins (a third
dearer a row, or under a third the cost) are far wider than a sleep's jitter."""

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
    "dear": "0.002 if rows == 1 else 0.003 * rows",
    "cheap": "0.004 + 0.001 * rows",
}
REQUESTS = 96
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
    # the second batch probes 8 rows, finds them dearer a row, and the cap stays at 1 (the next
    # upward probe is 32 batches on: at most 2 more)
    assert in_batches_over(rows, 1) <= 3 * 8
    assert rows[1] >= REQUESTS - 3 * 8


def test_adaptive_batching_forms_big_batches_where_batching_pays(repo: Path, mode: str) -> None:
    rows = run(repo, mode, "adaptive", "cheap")
    assert in_batches_over(rows, 4) > REQUESTS // 2
