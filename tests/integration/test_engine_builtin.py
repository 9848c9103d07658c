"""The built-in models (ONNX Runtime and XGBoost backends) through the engine, in both worker
modes: outputs equal calling the backend session directly, batched results equal unbatched ones."""

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from lumenrt.backends.base import Placement, get_backend
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.repository import ModelRepository
from lumenrt.models.builtin import MODEL_NAMES, builtin_examples, ensure_builtin_repository


@pytest.fixture(scope="module", params=["thread", "process"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    with Engine(settings=EngineConfig(worker_mode=request.param, thread_count=2)) as eng:
        yield eng


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_outputs_equal_the_backend_called_directly(engine: Engine, model: str) -> None:
    loaded = ModelRepository(ensure_builtin_repository()).load(model)[-1]
    session = get_backend(loaded.config.backend).load(loaded.model_path, loaded.config, Placement(cores=(0,)))
    try:
        inputs = builtin_examples(model)
        want = session.run(inputs)
    finally:
        session.close()
    got = engine.infer(model, inputs).outputs
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_batched_results_equal_unbatched_under_concurrency(engine: Engine, model: str) -> None:
    rows = builtin_examples(model)
    name = next(iter(rows))
    n = min(len(rows[name]), 8)
    alone = [engine.infer(model, {name: rows[name][i : i + 1]}).outputs for i in range(n)]
    together: list[dict[str, np.ndarray]] = [{} for _ in range(n)]

    def one(i: int) -> None:
        together[i] = engine.infer(model, {name: rows[name][i : i + 1]}).outputs

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for a, b in zip(alone, together, strict=True):
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6)
