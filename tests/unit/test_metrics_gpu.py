"""GPU figures in the metrics (observability/metrics.py ``gpu_families``): exported only for models
with GPU instances; device stage times as counters, memory per model and per device, and NVML's
utilization under Triton's names only where NVML answered."""

from typing import Any

from lumenrt.ingress.service import InferenceService
from tests.unit.test_metrics import LUMENRT, TRITON, FakeEngine, runtime, scrape, value


def gpu_stats(nvml: dict[str, float] | None) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": "cuda:0",
        "instances": 2,
        "model_memory_bytes": 4096,
        "process_memory_bytes": 1 << 20,
    }
    if nvml is not None:
        device["nvml"] = nvml
    return {
        "instances": 2,
        "batches": 10,
        "failures": 1,
        "copy_in_ns": 2_000_000,
        "compute_ns": 30_000_000,
        "copy_out_ns": 1_000_000,
        "memory_bytes": 4096,
        "pinned_bytes": 4096,
        "devices": {"0": device},
    }


def test_cpu_only_models_export_no_gpu_family() -> None:
    families = scrape(InferenceService(FakeEngine(runtime("a"))))  # type: ignore[arg-type]
    assert set(families) == set(TRITON) | set(LUMENRT)


def test_gpu_models_export_stage_times_memory_and_nvml() -> None:
    nvml = {"utilization": 0.75, "memory_used_bytes": 3e9, "memory_total_bytes": 80e9}
    families = scrape(InferenceService(FakeEngine(runtime("a", gpu=gpu_stats(nvml)), runtime("b"))))  # type: ignore[arg-type]
    stages = families["lumenrt_gpu_stage_seconds"]
    assert value(stages, "lumenrt_gpu_stage_seconds_total", model="a", stage="compute") == 0.03
    assert value(stages, "lumenrt_gpu_stage_seconds_total", model="a", stage="copy_in") == 0.002
    assert value(families["lumenrt_gpu_batch_failures"], "lumenrt_gpu_batch_failures_total", model="a") == 1
    assert (
        value(families["lumenrt_gpu_model_memory_bytes"], "lumenrt_gpu_model_memory_bytes", gpu="0") == 4096
    )
    assert (
        value(families["lumenrt_gpu_process_memory_bytes"], "lumenrt_gpu_process_memory_bytes", gpu="0")
        == 1 << 20
    )
    assert value(families["nv_gpu_utilization"], "nv_gpu_utilization", gpu="0") == 0.75
    assert value(families["nv_gpu_memory_total_bytes"], "nv_gpu_memory_total_bytes", gpu="0") == 80e9
    assert {s.labels["model"] for s in stages} == {"a"}  # the CPU model has none


def test_without_nvml_utilization_is_not_reported() -> None:
    families = scrape(InferenceService(FakeEngine(runtime("a", gpu=gpu_stats(None)))))  # type: ignore[arg-type]
    assert "lumenrt_gpu_stage_seconds" in families
    assert not {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"} & set(families)
