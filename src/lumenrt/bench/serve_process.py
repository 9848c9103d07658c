"""``lumenrt serve`` as a child process on loopback ports (benchmarks and the e2e tests).

The child is started with port 0 for each front end unless told otherwise; the ports are read
from its ``listening http=... grpc=... tcp=...`` line, and ``start_serve`` returns once it prints
``ready``. ``stop`` sends SIGTERM (a graceful drain) and returns the exit status.
"""

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

START_TIMEOUT_S = 180.0  # the first start builds the built-in models (seconds; generous for CI)


@dataclass
class ServeProcess:
    proc: "subprocess.Popen[str]"
    ports: dict[str, int]
    lines: list[str] = field(default_factory=list)  # everything it printed so far
    reader: threading.Thread | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, then wait; the exit status (killed after ``timeout_s``: raises)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            if self.reader is not None:
                self.reader.join(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def __enter__(self) -> "ServeProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_serve(
    *args: str,
    ports: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> ServeProcess:
    """Start ``lumenrt serve ARGS`` (every front end on a free port unless ``ports`` says) and wait
    until it is ready. ``command``: the ``lumenrt`` to run (default: this interpreter's). Raises
    RuntimeError with its output if it exits or never gets ready."""
    chosen = {"http": 0, "grpc": 0, "tcp": 0, **(ports or {})}
    cmd = [*(command or [sys.executable, "-m", "lumenrt.cli"]), "serve"]
    for name, port in chosen.items():
        cmd += [f"--{name}-port", str(port)]
    proc = subprocess.Popen(
        [*cmd, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env if env is not None else dict(os.environ),
        cwd=cwd,
    )
    lines: list[str] = []
    ready = threading.Event()
    seen_ready: list[bool] = []
    found: dict[str, int] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("lumenrt serve: listening"):
                found.update({k: int(v) for k, v in re.findall(r"(\w+)=[\d.]+:(\d+)", line)})
            if line.startswith("lumenrt serve: ready"):
                seen_ready.append(True)
                ready.set()
        ready.set()  # the process ended: stop waiting

    reader = threading.Thread(target=read, name="lumenrt-serve-output", daemon=True)
    reader.start()
    server = ServeProcess(proc, found, lines, reader)
    if not ready.wait(START_TIMEOUT_S) or not seen_ready:
        proc.kill()
        server.stop()
        raise RuntimeError("lumenrt serve did not become ready:\n" + "\n".join(lines))
    return server
