"""Issue 17's CUDA tests: run on a machine with a CUDA device (``benchmarks/gpu_check.sh`` runs
them and the short benchmark); skipped elsewhere, saying why. Nothing here has run on a GPU yet
in this repository's history: the CPU-side logic they rest on is tested against the fake device
(tests/unit/test_gpu_pipeline.py, tests/integration/test_engine_gpu.py).

- outputs on the GPU equal the CPU's within tolerance for every batch size up to the maximum
  (TorchScript and torch.export; FP16 autocast within FP16's tolerance; ONNX Runtime's CUDA
  provider where onnxruntime-gpu is installed);
- pinned staging buffers are allocated once at load (counted) and are page-locked;
- copies and compute are asynchronous: a launch queued behind a busy compute stream returns at
  once, its batch's events not yet complete (CUDA events), and the host waits on that batch only;
- a model with two GPU instances has both serving;
- a CUDA error in one batch (out of memory, raised when issued) fails that batch with a clear
  error, and the instance keeps serving.
"""

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch", reason="the GPU tests need PyTorch (pip install 'lumenrt[torch]')")
if not torch.cuda.is_available():
    pytest.skip(
        f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() False): these tests run on "
        "a GPU machine, see benchmarks/gpu_check.sh",
        allow_module_level=True,
    )

from lumenrt.engine.engine import Engine, EngineConfig  # noqa: E402
from lumenrt.engine.gpu import torch_device  # noqa: E402
from lumenrt.engine.gpu.staging import SETS  # noqa: E402
from lumenrt.engine.request import EngineError  # noqa: E402
from lumenrt.engine.slot_layout import DATA_AT  # noqa: E402

MAX_BATCH = 16
FEATURES = 64


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10), torch.nn.Softmax(-1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class OomOnFlag(torch.nn.Module):
    """``y = 2x``; a batch whose first value is -1e30 asks for 2**50 bytes of device memory: CUDA
    refuses when the work is issued (torch.OutOfMemoryError), a recoverable CUDA error."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x[0, 0] < -1e29):
            huge = torch.empty([1 << 48], dtype=torch.float32, device=x.device)
            return x + huge[0]
        return x * 2


class Heavy(torch.nn.Module):
    """Enough device work per batch (50 chained 1024x1024 matmuls) that requests queue while a
    batch runs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1024, 1024) / 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(50):
            h = torch.tanh(h @ self.w)
        return h


def save(module: torch.nn.Module, folder: Path, kind: str, features: int) -> str:
    module = module.eval()
    folder.mkdir(parents=True)
    if kind == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.script(module).save(str(folder / "model.pt"))
        return "model.pt"
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    program = torch.export.export(module, (torch.zeros(2, features),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(folder / "model.pt2"))
    return "model.pt2"


def write_model(
    root: Path, name: str, module: torch.nn.Module, kind: str, groups: list[dict[str, Any]], features: int,
    outputs: int, **extra: Any,
) -> None:  # fmt: skip
    save(module, root / name / "1", kind, features)
    config = {
        "backend": "pytorch",
        "max_batch_size": MAX_BATCH,
        "dynamic_batching": {"max_queue_delay_us": 0},
        "input": [{"name": "x", "datatype": "FP32", "dims": [features]}],
        "output": [{"name": "y", "datatype": "FP32", "dims": [outputs]}],
        "instance_group": groups,
        **extra,
    }
    (root / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module", params=["torchscript", "export"])
def mlp_repo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"gpu-{request.param}")
    module = Mlp()
    write_model(root, "cpu", module, request.param, [{"kind": "KIND_CPU", "count": 1}], FEATURES, 10)
    write_model(root, "gpu", module, request.param, [{"kind": "KIND_GPU", "count": 1}], FEATURES, 10)
    write_model(
        root, "gpu_fp16", module, request.param, [{"kind": "KIND_GPU"}], FEATURES, 10,
        optimization={"cuda": {"autocast": "FP16"}},
    )  # fmt: skip
    write_model(
        root, "gpu_graphs", module, request.param, [{"kind": "KIND_GPU"}], FEATURES, 10,
        dynamic_batching={"max_queue_delay_us": 0, "preferred_batch_size": [1, 4, 16]},
        optimization={"cuda": {"graphs": True}},
    )  # fmt: skip
    write_model(
        root, "gpu_direct", module, request.param, [{"kind": "KIND_GPU", "count": 2}], FEATURES, 10,
        optimization={"cuda": {"direct_copies": True}},
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def engine(mlp_repo: Path) -> Iterator[Engine]:
    with Engine(mlp_repo, EngineConfig(queue_type="mpmc")) as eng:
        yield eng


@pytest.mark.parametrize(
    ("model", "rtol", "atol"),
    [("gpu", 1e-4, 1e-6), ("gpu_graphs", 1e-4, 1e-6), ("gpu_fp16", 2e-2, 2e-3), ("gpu_direct", 1e-4, 1e-6)],
)
def test_gpu_outputs_match_cpu_for_every_batch_size(
    engine: Engine, model: str, rtol: float, atol: float
) -> None:
    rng = np.random.default_rng(17)
    for rows in range(1, MAX_BATCH + 1):
        x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
        want = engine.infer("cpu", {"x": x}).outputs["y"]
        got = engine.infer(model, {"x": x}).outputs["y"]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{model}, batch {rows}")
    gpu = engine.statistics(model)[0]["gpu"]
    assert gpu["batches"] >= MAX_BATCH and gpu["failures"] == 0
    # direct copies: every batch from the requests' arena slots (registered with CUDA at load)
    assert gpu["direct_batches"] == (gpu["batches"] if model == "gpu_direct" else 0)
    assert gpu["copy_in_ns"] > 0 and gpu["compute_ns"] > 0 and gpu["copy_out_ns"] > 0


def test_direct_copies_from_large_slots_match_cpu(mlp_repo: Path) -> None:
    # an arena slot holds 4 rows of x: the bigger requests go into large slots, registered too
    settings = EngineConfig(queue_type="mpmc", arena_slot_bytes=DATA_AT + 4 * FEATURES * 4)
    with Engine(mlp_repo, settings) as eng:
        rng = np.random.default_rng(18)
        for rows in range(1, MAX_BATCH + 1):
            x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
            want = eng.infer("cpu", {"x": x}).outputs["y"]
            got = eng.infer("gpu_direct", {"x": x}).outputs["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=f"batch {rows}")
        stats = eng.statistics("gpu_direct")[0]
        assert stats["arena_fallbacks"] == 0 and stats["large_arena"]["allocated"] == MAX_BATCH - 4
        assert stats["gpu"]["direct_batches"] == stats["gpu"]["batches"] >= MAX_BATCH


def test_pinned_buffers_are_allocated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    original = torch_device.TorchCudaDevice.host_buffer

    def counted(self: Any, shape: tuple[int, ...], dtype: Any, *, pinned: bool) -> Any:
        buffer = original(self, shape, dtype, pinned=pinned)
        made.append(buffer)
        return buffer

    monkeypatch.setattr(torch_device.TorchCudaDevice, "host_buffer", counted)
    write_model(tmp_path, "m", Mlp(), "export", [{"kind": "KIND_GPU"}], FEATURES, 10)
    with Engine(tmp_path, EngineConfig()) as eng:
        at_load = len(made)
        assert at_load == SETS * 2  # one input, one output, per set
        assert all(b.pinned and b.handle.is_pinned() for b in made)
        for rows in range(1, MAX_BATCH + 1):
            eng.infer("m", {"x": np.ones((rows, FEATURES), np.float32)})
        assert len(made) == at_load


def test_launch_returns_before_the_batch_completes(tmp_path: Path) -> None:
    write_model(tmp_path, "m", Mlp(), "export", [{"kind": "KIND_GPU"}], FEATURES, 10)
    with Engine(tmp_path, EngineConfig()) as eng:
        (worker,) = eng.runtime("m").workers._workers
        pipeline = worker.serving.pipeline  # the instance's own, idle between requests
        with torch.cuda.stream(pipeline.streams.compute):
            torch.cuda._sleep(1 << 30)  # the compute stream busy for a while (~0.5 s): the batch queues
        s = pipeline.sets[0]
        s.host_in["x"].array[:MAX_BATCH] = 1
        pipeline.launch(s, MAX_BATCH)
        assert not s.copy_out_end.query()  # issued, not done: launch did not wait for the device
        times = pipeline.wait(s)  # the host waits for this batch's own event
        assert s.copy_out_end.query() and times.compute_ns > 0 and times.copy_in_ns > 0


def test_two_gpu_instances_both_serve(tmp_path: Path) -> None:
    write_model(tmp_path, "m", Heavy(), "export", [{"kind": "KIND_GPU", "count": 2}], 1024, 1024)
    with Engine(tmp_path, EngineConfig()) as eng:

        async def load() -> list[Any]:
            x = np.ones((4, 1024), np.float32)
            return await asyncio.gather(*(eng.infer_async("m", {"x": x}) for _ in range(32)))

        results = asyncio.run(load())
        assert len(results) == 32
        served = [w.serving.stats.batches for w in eng.runtime("m").workers._workers]
        assert len(served) == 2 and all(n > 0 for n in served), served


def test_a_cuda_error_fails_its_batch_and_the_instance_keeps_serving(tmp_path: Path) -> None:
    write_model(tmp_path, "m", OomOnFlag(), "torchscript", [{"kind": "KIND_GPU"}], 4, 4)
    with Engine(tmp_path, EngineConfig()) as eng:
        bad = np.full((1, 4), -1e30, np.float32)
        with pytest.raises(
            EngineError, match=r"(?s)model 'm' on cuda:0 failed: .*(OutOfMemoryError|out of memory)"
        ):
            eng.infer("m", {"x": bad})
        for rows in (1, 5, MAX_BATCH):
            x = np.ones((rows, 4), np.float32)
            np.testing.assert_array_equal(eng.infer("m", {"x": x}).outputs["y"], x * 2)
        stats = eng.statistics("m")[0]
        assert stats["ready"] and stats["gpu"]["failures"] == 1


def test_onnx_on_the_cuda_provider_matches_cpu(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed (pip install onnxruntime-gpu in place of onnxruntime)")
    from tests.unit.test_backends import build_onnx

    built = build_onnx(tmp_path / "build")
    for name, group in (("cpu", {"kind": "KIND_CPU", "count": 1}), ("gpu", {"kind": "KIND_GPU"})):
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
        (tmp_path / "repo" / name / "1" / "model.onnx").write_bytes(built.model_path.read_bytes())
        config = {"backend": "onnxruntime", "max_batch_size": MAX_BATCH, "instance_group": [group]}
        (tmp_path / "repo" / name / "config.yaml").write_text(yaml.safe_dump(config))
    with Engine(tmp_path / "repo", EngineConfig()) as eng:
        x = next(iter(built.inputs.values()))
        for rows in range(1, min(len(x), MAX_BATCH) + 1):
            want = eng.infer("cpu", {k: v[:rows] for k, v in built.inputs.items()}).outputs
            got = eng.infer("gpu", {k: v[:rows] for k, v in built.inputs.items()}).outputs
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5)
