"""The models every peer serves: copied out of lumenrt's built-in repository with one example input
each (``.npz``, and the same bytes as perf_analyzer ``--input-data`` JSON)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from common import SESSIONS


@dataclass(frozen=True)
class ModelSpec:
    name: str
    onnx_path: Path  # the exported copy every peer serves
    sha256: str
    max_batch: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    instances: int  # the model config's instance_group count, else SESSIONS (Triton gets the same)
    inputs: tuple[dict[str, Any], ...]  # lumenrt config entries: name, datatype, dims
    outputs: tuple[dict[str, Any], ...]
    npz_path: Path  # example input, batch 1, one array per input name
    pa_json_path: Path  # the same bytes as perf_analyzer --input-data JSON


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def perf_analyzer_input(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """perf_analyzer's ``--input-data`` JSON for one request of batch 1: each tensor's raw bytes."""
    entry = {
        name: {"b64": base64.b64encode(np.ascontiguousarray(a[0]).tobytes()).decode("ascii")}
        for name, a in arrays.items()
    }
    return {"data": [entry]}


def export_model(name: str, repo: Path, runs_dir: Path) -> ModelSpec:
    """Copy ``name``'s model.onnx out of the built-in repository and write its example inputs."""
    from lumenrt.models.builtin import builtin_examples

    config = yaml.safe_load((repo / name / "config.yaml").read_text(encoding="utf-8"))
    onnx_path = runs_dir / "models" / name / "model.onnx"
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo / name / "1" / "model.onnx", onnx_path)
    arrays = {k: np.ascontiguousarray(v) for k, v in builtin_examples(name, 1).items()}
    npz_path = runs_dir / "inputs" / f"{name}.npz"
    npz_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(npz_path, **arrays)
    # JSON without the .json suffix: the dashboard takes every *.json under results/ for a result file
    pa_json_path = runs_dir / "inputs" / f"{name}.perf_analyzer-input"
    pa_json_path.write_text(json.dumps(perf_analyzer_input(arrays)), encoding="utf-8")
    batching = config.get("dynamic_batching") or {}
    return ModelSpec(
        name=name,
        onnx_path=onnx_path,
        sha256=_sha256(onnx_path),
        max_batch=int(config.get("max_batch_size", 0)),
        preferred_batch_sizes=tuple(int(b) for b in batching.get("preferred_batch_size", ())),
        max_queue_delay_us=int(batching.get("max_queue_delay_us", 0)),
        instances=int((config.get("instance_group") or {}).get("count") or SESSIONS),
        inputs=tuple(config["input"]),
        outputs=tuple(config["output"]),
        npz_path=npz_path,
        pa_json_path=pa_json_path,
    )
