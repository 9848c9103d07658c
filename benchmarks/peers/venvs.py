"""The peers' own virtual environments (``.venv-triton``, ``.venv-mlserver``, ``.venv-fastapi``): their
pins, creating or updating them when a marker file says the pins changed, and the versions inside."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, progress

MARKER_NAME = ".lumenrt-peer-pins.json"


@dataclass(frozen=True)
class VenvSpec:
    peer: str
    path: Path
    pins: tuple[str, ...]
    dists: tuple[str, ...]  # distributions whose versions the result file records


def dist_version(dist: str) -> str:
    return importlib.metadata.version(dist)


def venv_specs(root: Path = ROOT) -> dict[str, VenvSpec]:
    """Each non-lumenrt peer's venv and pins; ONNX Runtime (and numpy where it can) as in ``.venv``."""
    ort, numpy = dist_version("onnxruntime"), dist_version("numpy")
    return {
        # The Makefile's triton-peer recipe with numpy pinned (nvidia-pytriton needs numpy<2)
        "triton": VenvSpec(
            "triton",
            root / ".venv-triton",
            ("nvidia-pytriton==0.7.0", "numpy==1.26.4", f"onnxruntime=={ort}"),
            ("nvidia-pytriton", "numpy", "onnxruntime"),
        ),
        # uvloop<0.22: mlserver 1.7.1's inference workers call asyncio.get_event_loop() before any
        # loop exists, which uvloop 0.22+ turns into a RuntimeError (the workers die at start)
        "mlserver": VenvSpec(
            "mlserver",
            root / ".venv-mlserver",
            ("mlserver==1.7.1", "uvloop==0.21.0", f"numpy=={numpy}", f"onnxruntime=={ort}"),
            ("mlserver", "uvloop", "numpy", "onnxruntime"),
        ),
        # uvloop and httptools as in .venv (lumenrt's HTTP front end uses the same two)
        "fastapi": VenvSpec(
            "fastapi",
            root / ".venv-fastapi",
            (
                "fastapi==0.165.0",
                "uvicorn[standard]==0.54.0",
                f"uvloop=={dist_version('uvloop')}",
                f"httptools=={dist_version('httptools')}",
                f"numpy=={numpy}",
                f"onnxruntime=={ort}",
            ),
            ("fastapi", "uvicorn", "uvloop", "httptools", "numpy", "onnxruntime"),
        ),
    }


def venv_python(spec: VenvSpec) -> Path:
    return spec.path / "bin" / "python"


def marker_text(pins: Sequence[str]) -> str:
    return json.dumps({"pins": sorted(pins)}, indent=1) + "\n"


def venv_is_current(spec: VenvSpec) -> bool:
    marker = spec.path / MARKER_NAME
    if not venv_python(spec).exists() or not marker.is_file():
        return False
    return marker.read_text(encoding="utf-8") == marker_text(spec.pins)


def _base_python() -> str:
    """The interpreter ``.venv`` was made from (a venv made from a venv would chain to it)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_venv(spec: VenvSpec) -> None:
    """Create ``spec.path`` if missing and install its pins unless the marker says they are in."""
    if venv_is_current(spec):
        return
    if not venv_python(spec).exists():
        progress(f"creating {spec.path.name}")
        subprocess.run([_base_python(), "-m", "venv", str(spec.path)], check=True)
    progress(f"installing into {spec.path.name}: {' '.join(spec.pins)}")
    pip = [str(venv_python(spec)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *spec.pins], check=True)
    (spec.path / MARKER_NAME).write_text(marker_text(spec.pins), encoding="utf-8")


def venv_versions(spec: VenvSpec) -> dict[str, str]:
    """Installed versions of ``spec.dists`` inside the venv."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({d: m.version(d) for d in sys.argv[1:]}))"
    )
    proc = subprocess.run(
        [str(venv_python(spec)), "-c", code, *spec.dists], capture_output=True, text=True, check=True
    )
    versions: dict[str, str] = json.loads(proc.stdout)
    return versions
