"""GPU instances through the engine, on the fake device of tests/fake_device.py (no GPU needed):
a test backend whose GPU program computes ``y = 2x`` on the fake device's arrays. Answers,
instances of one model serving at once, CPU and GPU instances side by side, a failing batch
confined to itself, device statistics, nothing allocated per request; and, with the real
backends on this machine, the clear refusals (no CUDA, no onnxruntime-gpu, process mode).
The real CUDA runs are tests/gpu/test_cuda.py."""

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.backends.base import REGISTRY, Placement
from lumenrt.client import HttpClient
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.gpu import devices
from lumenrt.engine.gpu.device import DeviceError
from lumenrt.engine.request import EngineError
from lumenrt.engine.slot_layout import DATA_AT
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import InferenceService
from tests.fake_device import WAIT_GUARD_S, FakeDevice

SETTINGS = EngineConfig(queue_type="mpmc", thread_count=0)
IO = """
input: [{name: x, datatype: FP32, dims: [4]}]
output: [{name: y, datatype: FP32, dims: [4]}]
"""


class Rendezvous:
    """Armed after load: the first program to run waits until another instance's program runs, so
    that both instances have a batch on the device at once."""

    def __init__(self) -> None:
        self.armed = False
        self.holder: object = None
        self.other_ran = threading.Event()
        self.met: list[bool] = []

    def run(self, program: object) -> None:
        if not self.armed:
            return
        if self.holder is None:
            self.holder = program
            self.met.append(self.other_ran.wait(WAIT_GUARD_S))
        elif self.holder is not program:
            self.other_ran.set()


class DoublingProgram:
    """``y = 2x``; a row of -1s is a kernel that fails (reported at the batch's event)."""

    weight_bytes = 1024

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rendezvous = rendezvous

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        x = inputs["x"]
        if (x == -1).all(axis=-1).any():
            raise RuntimeError("an illegal instruction on the fake device")
        self.rendezvous.run(self)
        outputs["y"][...] = x * 2

    def close(self) -> None:
        pass


class DoublingSession:
    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


class FakeGpuBackend:
    name = "fakegpu"
    model_files: tuple[str, ...] = ("model.txt",)

    def __init__(self) -> None:
        self.rendezvous = Rendezvous()

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        raise ConfigError(config.source, "inputs", "list them")

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> DoublingSession:
        return DoublingSession()

    def check_gpu(self, config: ModelConfig) -> None:
        pass

    def load_gpu(self, model_path: Path, config: ModelConfig, device: Any, stream: Any) -> DoublingProgram:
        return DoublingProgram(self.rendezvous)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDevice]:
    dev = FakeDevice()
    monkeypatch.setattr(devices, "open_device", lambda index: dev)
    yield dev
    dev.close()


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> FakeGpuBackend:
    fake = FakeGpuBackend()
    monkeypatch.setitem(REGISTRY, fake.name, fake)
    return fake


def repository(
    root: Path, groups: str, backend: str = "fakegpu", file: str = "model.txt", extra: str = ""
) -> Path:
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / file).write_text("fake")
    (root / "m" / "config.yaml").write_text(
        f"backend: {backend}\nmax_batch_size: 8\ndynamic_batching: {{max_queue_delay_us: 0}}\n"
        f"instance_group: {groups}\n{IO}{extra}"
    )
    return root


def rows(n: int, start: float = 0.0) -> np.ndarray:
    return np.arange(start, start + 4 * n, dtype=np.float32).reshape(n, 4)


def forty_concurrent_requests(engine: Engine) -> None:
    """40 requests of 1 to 3 rows in flight at once, each answered with its own rows doubled."""

    async def many() -> list[Any]:
        return await asyncio.gather(*(engine.infer_async("m", {"x": rows(1 + i % 3, i)}) for i in range(40)))

    for i, result in enumerate(asyncio.run(many())):
        np.testing.assert_array_equal(result.outputs["y"], rows(1 + i % 3, i) * 2)


MIXED = "[{kind: KIND_CPU, count: 1}, {kind: KIND_GPU}]"


def plan_json(engine: Engine) -> dict[str, Any]:
    assert engine.plan is not None
    return engine.plan.to_json()


def check_no_leaks(engine: Engine) -> None:
    for name in engine.models():
        rt = engine.runtime(name)
        assert rt.table.free == len(rt.table.records), "request records leaked"


def test_gpu_instances_answer_and_report_device_stages(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    with Engine(repository(tmp_path, "[{kind: KIND_GPU, count: 2}]"), SETTINGS) as engine:
        at_load = dict(device.counts)
        forty_concurrent_requests(engine)
        stats = engine.statistics("m")[0]
        gpu = stats["gpu"]
        assert stats["workers"] == gpu["instances"] == 2 and stats["requests"] == 40
        assert gpu["batches"] == stats["batches"] >= 1 and gpu["failures"] == 0
        assert gpu["copy_in_ns"] > 0 and gpu["compute_ns"] > 0 and gpu["copy_out_ns"] > 0
        assert gpu["memory_bytes"] == 2 * (1024 + 2 * 2 * 8 * 4 * 4)  # weights + 2 sets x (in, out)
        assert gpu["devices"]["0"]["instances"] == 2 and "nvml" not in gpu["devices"]["0"]
        assert stats["infer_ns"] > 0 and stats["input_ns"] > 0  # the device's stages, as Triton's
        # nothing allocated on the device or pinned per request, and no device-wide wait
        assert {k: device.counts[k] for k in ("host_buffer", "device_buffer", "stream", "event")} == {
            k: at_load[k] for k in ("host_buffer", "device_buffer", "stream", "event")
        }
        assert device.counts["synchronize"] == 0
        assert [w["gpu"] for w in plan_json(engine)["models"]["m"]["workers"]] == [0, 0]
        check_no_leaks(engine)


def test_two_gpu_instances_of_one_model_run_batches_at_once(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    with Engine(repository(tmp_path, "[{kind: KIND_GPU, count: 2}]"), SETTINGS) as engine:
        device.host_waiting.clear()  # set by the warm-ups
        backend.rendezvous.armed = True

        async def both() -> list[Any]:
            one = asyncio.ensure_future(engine.infer_async("m", {"x": rows(1)}))
            # once the worker holding the first batch waits for it, only the other instance can
            # take the second: the first batch computes until the second one runs beside it
            assert await asyncio.to_thread(device.host_waiting.wait, WAIT_GUARD_S)
            two = asyncio.ensure_future(engine.infer_async("m", {"x": rows(1, 100)}))
            return list(await asyncio.gather(one, two))

        results = asyncio.run(both())
        assert backend.rendezvous.met == [True]
        np.testing.assert_array_equal(results[1].outputs["y"], rows(1, 100) * 2)


def test_cpu_and_gpu_instances_of_one_model_serve_side_by_side(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    with Engine(repository(tmp_path, MIXED), SETTINGS) as engine:
        for i in range(10):
            np.testing.assert_array_equal(engine.infer("m", {"x": rows(2, i)}).outputs["y"], rows(2, i) * 2)
        stats = engine.statistics("m")[0]
        assert stats["workers"] == 2 and stats["gpu"]["instances"] == 1
        assert sorted(w["gpu"] for w in plan_json(engine)["models"]["m"]["workers"]) == [-1, 0]
        # the model config the front ends answer (Triton's form) lists both groups
        groups = InferenceService(engine).model_config("m")["instance_group"]
        assert [(g["kind"], g["count"], g["gpus"]) for g in groups] == [
            ("KIND_CPU", 1, []),
            ("KIND_GPU", 1, [0]),
        ]


@pytest.mark.parametrize(("groups", "reported"), [("[{kind: KIND_GPU}]", "fixed"), (MIXED, "adaptive")])
def test_gpu_instances_batch_as_configured_under_adaptive_batching(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend, groups: str, reported: str
) -> None:
    settings = EngineConfig(queue_type="mpmc", thread_count=0, batching="adaptive")
    with Engine(repository(tmp_path, groups), settings) as engine:
        forty_concurrent_requests(engine)
        # a model with GPU instances only batches as configured; with CPU workers too, they adapt
        assert engine.statistics("m")[0]["batching"] == reported
        check_no_leaks(engine)


def test_a_failing_batch_fails_alone_and_the_instance_keeps_serving(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    with Engine(repository(tmp_path, "[{kind: KIND_GPU}]"), SETTINGS) as engine:
        bad = np.full((1, 4), -1, np.float32)
        with pytest.raises(
            EngineError, match=r"model 'm' on fake:0 failed: DeviceError: .*illegal instruction"
        ):
            engine.infer("m", {"x": bad})
        np.testing.assert_array_equal(engine.infer("m", {"x": rows(3)}).outputs["y"], rows(3) * 2)
        device.refuse_next_launch(MemoryError("CUDA out of memory"))  # refused when issued
        with pytest.raises(EngineError, match="MemoryError: CUDA out of memory"):
            engine.infer("m", {"x": rows(1)})
        np.testing.assert_array_equal(engine.infer("m", {"x": rows(2)}).outputs["y"], rows(2) * 2)
        stats = engine.statistics("m")[0]
        assert stats["failures"] == 2 and stats["gpu"]["failures"] == 2 and stats["ready"]
        check_no_leaks(engine)


DIRECT = "optimization: {cuda: {direct_copies: true}}\n"


def test_after_a_fault_that_poisons_the_device_every_batch_is_answered_with_its_error(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    with Engine(repository(tmp_path, "[{kind: KIND_GPU}]", extra=DIRECT), SETTINGS) as engine:
        device.sticky_errors = True  # as CUDA after an illegal address: records and waits fail too

        def infer(x: np.ndarray) -> Any:  # asynchronous: were the worker dead, the deadline answers
            return asyncio.run(engine.infer_async("m", {"x": x}, timeout_s=10))

        with pytest.raises(
            EngineError, match=r"model 'm' on fake:0 failed: DeviceError: .*illegal instruction"
        ):
            infer(np.full((1, 4), -1, np.float32))
        for n in (1, 3):  # then every batch fails when issued, with an answer, and the worker lives on
            with pytest.raises(
                EngineError, match=r"model 'm' on fake:0 failed: RuntimeError: CUDA error \(sticky\)"
            ):
                infer(rows(n))
        stats = engine.statistics("m")[0]
        assert stats["gpu"]["failures"] == 3 and stats["ready"]
        check_no_leaks(engine)


@pytest.mark.parametrize("allocator", ["lumen_arena", "standard"])
def test_direct_copies_send_each_request_from_where_it_lies_with_no_gather(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend, allocator: str
) -> None:
    settings = EngineConfig(queue_type="mpmc", thread_count=0, allocator_type=allocator)
    with Engine(repository(tmp_path, "[{kind: KIND_GPU, count: 2}]", extra=DIRECT), settings) as engine:
        # the arena's region is registered once for the model's two instances (none without an arena)
        assert list(device.registered.values()) == ([2] if allocator == "lumen_arena" else [])
        loaded = len(device.issued)
        forty_concurrent_requests(engine)
        gpu = engine.statistics("m")[0]["gpu"]
        assert gpu["direct_batches"] == gpu["batches"] >= 1 and gpu["failures"] == 0
        assert gpu["pinned_bytes"] == 2 * 2 * 8 * 4 * 4  # output staging only: 2 instances x 2 sets
        region = engine.runtime("m").region  # page-locked in place, once for both instances
        assert gpu["registered_bytes"] == (len(memoryview(region)) if allocator == "lumen_arena" else 0)
        # one copy to the device per request (one input each), none from the staging buffers
        copies = Counter(op.kind for op in device.issued[loaded:] if op.kind.startswith("copy_"))
        assert copies == {"copy_rows_to_device": 40, "copy_to_host": gpu["batches"]}
        bad = np.full((1, 4), -1, np.float32)  # a failing batch still fails alone
        with pytest.raises(EngineError, match="illegal instruction"):
            engine.infer("m", {"x": bad})
        np.testing.assert_array_equal(engine.infer("m", {"x": rows(2)}).outputs["y"], rows(2) * 2)
        check_no_leaks(engine)
    assert device.registered == {}  # given back at unload, before the region can go
    assert device.counts["unregister_host"] == device.counts["register_host"]


def test_a_request_too_big_for_an_arena_slot_goes_into_a_large_slot_and_straight_to_the_device(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    # an arena slot holds 4 rows of x; a request of up to max_batch_size (8) rows fits a large slot
    settings = EngineConfig(queue_type="mpmc", thread_count=0, arena_slot_bytes=DATA_AT + 64)
    with Engine(repository(tmp_path, "[{kind: KIND_GPU}]", extra=DIRECT), settings) as engine:
        loaded = len(device.issued)
        forty_concurrent_requests(engine)  # 1 to 3 rows: arena slots

        async def big() -> list[Any]:
            return await asyncio.gather(
                *(engine.infer_async("m", {"x": rows(5 + i % 4, i)}) for i in range(12))
            )

        for i, result in enumerate(asyncio.run(big())):
            np.testing.assert_array_equal(result.outputs["y"], rows(5 + i % 4, i) * 2)
        stats = engine.statistics("m")[0]
        assert stats["arena_fallbacks"] == 0
        assert stats["arena"]["allocated"] == 40 and stats["large_arena"]["allocated"] == 12
        assert stats["arena"]["in_use"] == stats["large_arena"]["in_use"] == 0
        # every request's rows copied to the device from the registered region, none gathered
        copies = Counter(op.kind for op in device.issued[loaded:] if op.kind.startswith("copy_"))
        assert (
            copies["copy_rows_to_device"] == 52 and stats["gpu"]["direct_batches"] == stats["gpu"]["batches"]
        )
        check_no_leaks(engine)


def test_an_http_body_too_big_for_an_arena_slot_is_received_into_a_large_slot(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.txt").write_text("fake")
    (tmp_path / "m" / "config.yaml").write_text(
        "backend: fakegpu\nmax_batch_size: 8\ndynamic_batching: {max_queue_delay_us: 0}\n"
        f"instance_group: [{{kind: KIND_GPU}}]\n{DIRECT}"
        "input: [{name: x, datatype: FP32, dims: [4096]}]\noutput: [{name: y, datatype: FP32, dims: [4096]}]\n"
    )
    # an arena slot holds 4 rows (64 KiB); 6 rows (96 KiB, over the 64 KiB a body needs to be
    # received in place) arrive straight into a large slot, and go to the device from there
    settings = EngineConfig(queue_type="mpmc", thread_count=0, arena_slot_bytes=DATA_AT + (64 << 10))
    x = np.arange(6 * 4096, dtype=np.float32).reshape(6, 4096)
    with (
        Engine(tmp_path, settings) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None)) as st,
        HttpClient(port=st.ports["http"]) as client,
    ):
        np.testing.assert_array_equal(client.infer("m", {"x": x}).outputs["y"], x * 2)
        stats = engine.statistics("m")[0]
        assert stats["inputs_in_place"] == 1 and stats["arena_fallbacks"] == 0
        assert stats["large_arena"]["allocated"] == 1 and stats["large_arena"]["in_use"] == 0
        rt = engine.runtime("m")
        assert rt.receiving == rt.receiving_large == 0  # the lend ended with the request
        assert stats["gpu"]["direct_batches"] == stats["gpu"]["batches"]
        check_no_leaks(engine)


def test_large_arena_bytes_0_leaves_big_requests_to_fresh_arrays(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    settings = EngineConfig(
        queue_type="mpmc", thread_count=0, arena_slot_bytes=DATA_AT + 64, large_arena_bytes=0
    )
    with Engine(repository(tmp_path, "[{kind: KIND_GPU}]"), settings) as engine:
        np.testing.assert_array_equal(engine.infer("m", {"x": rows(6)}).outputs["y"], rows(6) * 2)
        stats = engine.statistics("m")[0]
        assert stats["large_arena"] is None and stats["arena_fallbacks"] == 1
        check_no_leaks(engine)


def test_a_cpu_model_has_no_large_arena(tmp_path: Path) -> None:
    settings = EngineConfig(queue_type="mpmc", thread_count=0, arena_slot_bytes=DATA_AT + 64)
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text(f"backend: python\nmax_batch_size: 8\n{IO}")
    (tmp_path / "m" / "1" / "model.py").write_text(
        "class Model:\n    def load(self):\n        pass\n\n    def infer(self, inputs):\n        return {'y': inputs['x'] * 2}\n"
    )
    with Engine(tmp_path, settings) as engine:
        np.testing.assert_array_equal(engine.infer("m", {"x": rows(6)}).outputs["y"], rows(6) * 2)
        stats = engine.statistics("m")[0]
        assert stats["large_arena"] is None and stats["arena_fallbacks"] == 1


def test_gpu_instances_need_the_thread_pool(
    tmp_path: Path, device: FakeDevice, backend: FakeGpuBackend
) -> None:
    with pytest.raises(ValueError, match=r"KIND_GPU instances need the thread pool \(--mode thread\)"):
        Engine(repository(tmp_path, "[{kind: KIND_GPU}]"), EngineConfig(worker_mode="process"))


def test_a_backend_without_gpu_instances_is_named(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(
        "class M:\n    def load(self):\n        pass\n\n    def infer(self, inputs):\n        return inputs\n"
    )
    (tmp_path / "m" / "config.yaml").write_text(
        f"backend: python\nmax_batch_size: 8\ninstance_group: [{{kind: KIND_GPU}}]\n{IO}"
    )
    with pytest.raises(ConfigError, match="the python backend has no GPU instances"):
        Engine(tmp_path, SETTINGS)


def test_pytorch_gpu_instance_without_cuda_says_so(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/gpu/test_cuda.py runs models on it")
    # refused before the model file is read: its bytes do not matter
    root = repository(tmp_path, "[{kind: KIND_GPU}]", "pytorch", "model.pt2")
    with pytest.raises(
        DeviceError, match=r"cuda:0: no CUDA device: torch .* torch.cuda.is_available\(\) False"
    ):
        Engine(root, SETTINGS)


def test_onnx_gpu_instance_without_onnxruntime_gpu_names_it(tmp_path: Path) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here")
    import onnx
    from onnx import TensorProto, helper

    accelerator = "optimization: {execution_accelerators: {gpu_execution_accelerator: [{name: cuda}]}}\n"
    root = repository(tmp_path, "[{kind: KIND_GPU}]", "onnxruntime", "model.onnx", accelerator)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "same", io[:1], io[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, root / "m" / "1" / "model.onnx")
    with pytest.raises(ConfigError) as caught:
        Engine(root, SETTINGS)
    assert caught.value.field == "optimization.execution_accelerators.gpu_execution_accelerator[0].name"
    assert "install onnxruntime-gpu in its place" in caught.value.problem
