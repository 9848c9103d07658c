"""Engine.infer_async(borrow=True): an in-process caller lends its input arrays, and thread workers
read them where they are instead of a copy in the model's arena; process workers copy them all
the same (they read shared memory), and so does the thread pool for an array that is not
C-contiguous."""

import asyncio
from pathlib import Path

import numpy as np
import pytest

from lumenrt import Engine, EngineConfig
from tests.integration import borrow_state as state

MODEL_PY = """
import numpy as np

from tests.integration.borrow_state import CALLER, SHARED


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        SHARED.append(bool(CALLER) and np.shares_memory(x, CALLER[0]))
        return {"y": x * 2}
"""


def repository(root: Path) -> Path:
    (root / "lend" / "1").mkdir(parents=True)
    (root / "lend" / "1" / "model.py").write_text(MODEL_PY)
    (root / "lend" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 4\n"
        "input:\n  - {name: x, datatype: FP32, dims: [3]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [3]}\n"
        "instance_group: {count: 1}\n"
    )
    return root


@pytest.fixture(autouse=True)
def clean_state() -> None:
    state.CALLER.clear()
    state.SHARED.clear()


def infer(engine: Engine, x: np.ndarray, borrow: bool) -> np.ndarray:
    async def one() -> np.ndarray:
        result = await engine.infer_async("lend", {"x": x}, borrow=borrow)
        return result.outputs["y"]

    return asyncio.run(one())


def test_a_borrowed_input_is_read_in_place_by_a_thread_worker(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    state.CALLER.append(x)
    with Engine(repository(tmp_path), EngineConfig(lane="queue"), models=["lend"]) as engine:
        np.testing.assert_array_equal(infer(engine, x, borrow=True), x * 2)
        np.testing.assert_array_equal(infer(engine, x, borrow=False), x * 2)
        stats = engine.runtime("lend").statistics()
    assert state.SHARED == [True, False]  # borrowed: the caller's memory; by default: a copy
    assert stats["inputs_borrowed"] == 1


def test_an_array_that_is_not_contiguous_is_copied(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]  # a strided view
    state.CALLER.append(x)
    with Engine(repository(tmp_path), EngineConfig(lane="queue"), models=["lend"]) as engine:
        np.testing.assert_array_equal(infer(engine, x, borrow=True), x * 2)
        assert engine.runtime("lend").statistics()["inputs_borrowed"] == 0
    assert state.SHARED == [False]


def test_process_workers_copy_a_borrowed_input(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    settings = EngineConfig(worker_mode="process", lane="queue")
    with Engine(repository(tmp_path), settings, models=["lend"]) as engine:
        np.testing.assert_array_equal(infer(engine, x, borrow=True), x * 2)
        assert engine.runtime("lend").statistics()["inputs_borrowed"] == 0
