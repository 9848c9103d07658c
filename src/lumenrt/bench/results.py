"""Result files shared by the benchmarks: which machine, which commit, which configuration."""

import json
import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_GIT_TIMEOUT_S = 10.0  # guessed: ample for two local git calls


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        return None
    return None


def _memory_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the file says kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """Hostname, platform, kernel, CPU model, CPU counts, Python version, memory, load average,
    and how idle CPUs sleep (placement/cpu_idle.py: on a VM it moves low-load latency)."""
    from lumenrt.placement.cpu_idle import read_cpu_idle

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "memory_total_bytes": _memory_total_bytes(),
        "load_average": _load_average(),
        "cpu_idle": read_cpu_idle().as_dict(),
    }


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_commit(cwd: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the source tree (or ``cwd``), with ``-dirty`` if files changed.

    Tries the directory of the installed package first (an editable install lives in the repo),
    then the current directory; None when neither is a git checkout.
    """
    candidates = [cwd] if cwd is not None else [Path(__file__).resolve().parent, Path.cwd()]
    for where in candidates:
        head = _git(["rev-parse", "HEAD"], where)
        if head is None:
            continue
        status = _git(["status", "--porcelain"], where)
        dirty = "-dirty" if status is None or status.strip() else ""
        return head.strip() + dirty
    return None


def utc_stamp() -> str:
    """The current UTC time as ``YYYYmmddTHHMMSSZ``, for file names."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def new_result_path(out_dir: str | Path, name: str) -> Path:
    """``out_dir/<name>-<UTC timestamp>.json``, a name not taken yet (the folder is created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = utc_stamp()
    path = out / f"{name}-{stamp}.json"
    n = 1
    while path.exists():
        path = out / f"{name}-{stamp}-{n}.json"
        n += 1
    return path


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (a reader sees the old file or the whole new one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_result(out_dir: str | Path, name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as ``out_dir/<name>-<UTC timestamp>.json`` (never overwriting); the path."""
    path = new_result_path(out_dir, name)
    write_json(path, payload)
    return path
