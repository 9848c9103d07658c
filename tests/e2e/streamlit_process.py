"""``lumenrt dashboard`` as a real process and headless Chromium to read it: what both dashboard
browser tests share (test_dashboard.py, test_dashboard_live.py)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
START_TIMEOUT_S = 60.0  # Streamlit's first start on a loaded 2-core machine takes a few seconds
STOP_TIMEOUT_S = 30.0

needs_chromium = pytest.mark.skipif(
    not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
    reason=f"needs Debian's chromium and chromedriver ({CHROMIUM}, {CHROMEDRIVER}): apt-get install "
    "chromium chromium-driver",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str) -> int | None:
    """The status of a GET (None: nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc), to clean up if the launcher itself hangs."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@contextlib.contextmanager
def dashboard_process(args: list[str], log_path: Path) -> Iterator[str]:
    """``lumenrt dashboard ARGS --port P --no-browser``, up (its health endpoint answers); yields its
    URL. On leaving: SIGTERM, and exit status 0 required (the launcher forwards the signal to
    Streamlit; both are killed if it hangs)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lumenrt.cli", "dashboard", *args, "--port", str(port), "--no-browser"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    status: int | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while http_status(url + "_stcore/health") != 200:
            assert proc.poll() is None, f"dashboard exited with {proc.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, (
                f"dashboard not up in {START_TIMEOUT_S} s:\n{log_path.read_text()}"
            )
            time.sleep(0.2)  # polling the health endpoint, within a bound
        yield url
    finally:
        streamlit = _children(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *streamlit]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert status == 0, f"dashboard exit status {status} after SIGTERM:\n{log_path.read_text()}"


@contextlib.contextmanager
def chromium() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
