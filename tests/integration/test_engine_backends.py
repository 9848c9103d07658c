"""Every backend through the engine (ONNX Runtime, XGBoost both predictors, PyTorch TorchScript and
torch.export, Python), in both worker modes and, in thread mode, both allocators: outputs equal
calling the model directly, and rows sent concurrently (so batched together) equal rows sent alone.
The models are the tiny real ones of tests/unit/test_backends.py; queue types are covered for every
mode by test_engine.py and test_engine_process.py."""

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from lumenrt.engine.engine import Engine, EngineConfig
from tests.unit.test_backends import BUILDERS, Case

SETUPS = [("thread", "lumen_arena"), ("thread", "standard"), ("process", "lumen_arena")]


def write_repository(case: Case, root: Path, name: str) -> None:
    """The case's model file and a config.yaml for it, as a repository folder."""
    folder = root / name
    (folder / "1").mkdir(parents=True)
    shutil.copy(case.model_path, folder / "1" / case.model_path.name)
    for extra in case.model_path.parent.iterdir():  # e.g. the python model's weights
        if extra != case.model_path and extra.is_file():
            shutil.copy(extra, folder / "1" / extra.name)
    cfg = case.config
    raw: dict[str, Any] = {
        "backend": cfg.backend,
        "max_batch_size": max(cfg.max_batch_size, len(next(iter(case.inputs.values())))),
        "dynamic_batching": {"max_queue_delay_us": 3000, "preferred_batch_size": [4]},
    }
    if cfg.inputs:
        raw["input"] = [{"name": t.name, "datatype": t.datatype, "dims": list(t.dims)} for t in cfg.inputs]
    if cfg.outputs:
        raw["output"] = [{"name": t.name, "datatype": t.datatype, "dims": list(t.dims)} for t in cfg.outputs]
    if cfg.parameters:
        raw["parameters"] = dict(cfg.parameters)
    (folder / "config.yaml").write_text(yaml.safe_dump(raw))


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Case, Path]:
    name = request.param.replace("-", "_")
    built = BUILDERS[request.param](tmp_path_factory.mktemp(f"model-{request.param}"))
    repo = tmp_path_factory.mktemp(f"repo-{request.param}")
    write_repository(built, repo, name)
    return name, built, repo


@pytest.fixture(params=SETUPS, ids=lambda s: f"{s[0]}-{s[1]}")
def engine(
    request: pytest.FixtureRequest, case: tuple[str, Case, Path]
) -> Iterator[tuple[Engine, str, Case]]:
    name, built, repo = case
    mode, allocator = request.param
    settings = EngineConfig(worker_mode=mode, allocator_type=allocator, thread_count=2)
    with Engine(repo, settings, models=[name]) as eng:
        yield eng, name, built
        for stats in eng.statistics():
            arena = stats["arena"]
            assert arena is None or arena["in_use"] == 0, "arena slots leaked"
        rt = eng.runtime(name)
        assert rt.table.free == len(rt.table.records), "request records leaked"


def test_outputs_equal_calling_the_model_directly(engine: tuple[Engine, str, Case]) -> None:
    eng, name, case = engine
    got = eng.infer(name, case.inputs).outputs
    want = case.reference(case.inputs)
    assert set(got) == set(want)
    for key, expected in want.items():
        assert got[key].shape == expected.shape, key
        np.testing.assert_allclose(got[key], expected, rtol=case.rtol, atol=case.atol, err_msg=key)


def test_concurrent_rows_batched_equal_rows_alone(engine: tuple[Engine, str, Case]) -> None:
    eng, name, case = engine
    n = len(next(iter(case.inputs.values())))
    single = [{k: v[i : i + 1] for k, v in case.inputs.items()} for i in range(n)]
    alone = [eng.infer(name, x).outputs for x in single]
    together: list[dict[str, np.ndarray[Any, Any]]] = [{} for _ in range(n)]
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        barrier.wait(10)
        together[i] = eng.infer(name, single[i]).outputs

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for a, b in zip(alone, together, strict=True):
        assert set(a) == set(b)
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=case.rtol, atol=case.atol, err_msg=key)
