"""Server processes and the HTTP calls that watch them: free ports, starting a command in its own
process group with its output in a log, waiting until it answers, and stopping it (group included)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from common import progress

START_TIMEOUT_S = 300.0  # a server's start, models loaded (Triton's first start is the slowest)
STOP_GRACE_S = 30.0  # SIGTERM, then SIGKILL to the process group


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of GET ``url``; (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, ValueError):
        return 0, b""


def http_post_ok(url: str, body: bytes, timeout_s: float = 10.0) -> bool:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except (OSError, ValueError):
        return False


def server_metadata(http_base: str) -> dict[str, Any]:
    """KServe V2 server metadata (``GET /v2``): name, version, extensions; {} if none."""
    status, body = http_get(f"{http_base}/v2")
    if status != 200:
        return {}
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        if isinstance(data, dict):
            return data
    return {}


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def spawn(cmd: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``cmd`` in its own process group (so its children can be killed with it), output to a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


def wait_ready(proc: subprocess.Popen[bytes], is_ready: Callable[[], bool], log_path: Path, what: str,
               timeout_s: float = START_TIMEOUT_S) -> float:  # fmt: skip
    """Poll ``is_ready`` until true; the seconds it took. RuntimeError (with the log's tail) if the
    process exits first or the time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode} before it was ready:\n{log_tail(log_path)}")
        if is_ready():
            return time.monotonic() - t0
        time.sleep(0.25)
    raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s:\n{log_tail(log_path)}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL to the whole process group (stragglers too)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    return proc.returncode


@contextlib.contextmanager
def managed(cmd: Sequence[str], log_path: Path, what: str, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    proc = spawn(cmd, log_path, env, cwd)
    try:
        yield proc
    finally:
        code = stop_process(proc)
        progress(f"{what} stopped (exit {code})")
