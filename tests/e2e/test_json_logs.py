"""``lumenrt serve --log-format json`` (#16: what a container platform's log collector parses):
every line on stdout is one JSON object, the lifecycle lines and the log records alike, with
time, level, logger and message; errors included."""

import json
import signal
import subprocess
import sys
import time


def test_every_stdout_line_is_a_json_object() -> None:
    cmd = [sys.executable, "-m", "lumenrt.cli", "serve", "--log-format", "json", "--models", "digits_mlp",
           "--http-port", "0", "--grpc-port", "off", "--tcp-port", "off", "--log-level", "debug"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            lines.append(line)
            if "lumenrt serve: ready" in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines += out.splitlines()
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in lines if line.strip()]  # raises on any line that is not JSON
    assert all({"time", "level", "logger", "message"} <= set(d) for d in docs)
    messages = [d["message"] for d in docs]
    assert any(m.startswith("lumenrt serve: listening http=") for m in messages)
    assert any(m.startswith("lumenrt serve: ready, models: digits_mlp") for m in messages)
    assert messages[-1] == "lumenrt serve: stopped"
    assert any(
        d["logger"].startswith("lumenrt.") and d["logger"] != "lumenrt.serve" for d in docs
    )  # records too


def test_a_startup_error_is_a_json_line_too() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "lumenrt.cli", "serve", "--log-format", "json", "--metrics-port", "0", "--no-metrics"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    (doc,) = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert doc["level"] == "error" and "--metrics-port and --no-metrics" in doc["message"]
