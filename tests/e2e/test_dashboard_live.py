"""``lumenrt dashboard --live`` against a real ``lumenrt serve``, read by real headless Chromium.

The test starts the server (built-in models, port 0), sends a bounded trickle of digits_mlp
requests over HTTP from a thread, starts ``python -m lumenrt.cli dashboard --live
http://127.0.0.1:PORT --port P --no-browser`` (the base URL: the page scrapes ``/metrics``), and
waits until the page shows the model's name and a throughput above 0 requests/s. Teardown stops
the dashboard with SIGTERM (exit status 0) and the server (exit status 0).
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from lumenrt.client.http import HttpClient
from lumenrt.dashboard.live_app import model_key
from lumenrt.models.builtin import builtin_examples
from tests.e2e.conftest import ServeProcess, start_serve

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MODEL = "digits_mlp"
START_TIMEOUT_S = 60.0  # Streamlit's first start on a loaded 2-core machine takes a few seconds
SHOW_TIMEOUT_S = 90.0  # two scrapes (1 s apart) plus a Streamlit rerun in software-rendered Chromium
STOP_TIMEOUT_S = 30.0
TRICKLE_MAX_REQUESTS = 3000  # bounded: 20 requests/s for the longest the test can wait
TRICKLE_GAP_S = 0.05

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
    reason=f"needs Debian's chromium and chromedriver ({CHROMIUM}, {CHROMEDRIVER}): apt-get install "
    "chromium chromium-driver",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_status(url: str) -> int | None:
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


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    served = start_serve("--workers", "1")
    yield served
    assert served.stop() == 0, "\n".join(served.lines)


@pytest.fixture
def trickle(server: ServeProcess) -> Iterator[list[int]]:
    """A thread sending at most TRICKLE_MAX_REQUESTS requests, paced, until the test ends; the list
    holds how many were answered."""
    stop = threading.Event()
    answered = [0]
    x = builtin_examples(MODEL, 1)["input"]

    def send() -> None:
        with HttpClient("127.0.0.1", server.ports["http"], timeout_s=10) as client:
            for _ in range(TRICKLE_MAX_REQUESTS):
                if stop.is_set():
                    return
                client.infer(MODEL, {"input": x})
                answered[0] += 1
                stop.wait(TRICKLE_GAP_S)  # pacing, not a readiness wait

    thread = threading.Thread(target=send, name="live-trickle", daemon=True)
    thread.start()
    yield answered
    stop.set()
    thread.join(15)
    assert not thread.is_alive()


@pytest.fixture
def live_dashboard(server: ServeProcess, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    base = f"http://127.0.0.1:{server.ports['http']}"
    status = _get_status(base + "/metrics")
    if status != 200:
        pytest.fail(f"lumenrt serve does not serve GET /metrics (got {status}): the live view needs it")
    port = _free_port()
    log_path = tmp_path / "dashboard.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lumenrt.cli",
                "dashboard",
                "--live",
                base,
                "--port",
                str(port),
                "--no-browser",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/"
    exit_status: int | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _get_status(url + "_stcore/health") != 200:
            assert proc.poll() is None, f"dashboard exited with {proc.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, (
                f"dashboard not up in {START_TIMEOUT_S} s:\n{log_path.read_text()}"
            )
            time.sleep(0.2)  # polling the health endpoint within a bound
        assert f"live {base}/metrics" in log_path.read_text()  # the launcher said what it scrapes
        yield url, log_path
    finally:
        streamlit = _children(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            exit_status = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *streamlit]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert exit_status == 0, f"dashboard exit status {exit_status} after SIGTERM:\n{log_path.read_text()}"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def _page_state(driver: WebDriver) -> tuple[list[str], dict[str, str], list[str]]:
    """The model headings, MODEL's metrics (label -> value) and the alerts on the page."""
    main = '[data-testid="stMain"]'
    headings = [h.text.strip() for h in driver.find_elements(By.CSS_SELECTOR, f"{main} h3")]
    metrics = {}
    box = f".st-key-{model_key(MODEL)}"  # each model's headline numbers are in a container of their own
    for metric in driver.find_elements(By.CSS_SELECTOR, f'{box} [data-testid="stMetric"]'):
        label = metric.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text.strip()
        metrics[label] = metric.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text.strip()
    alerts = [a.text for a in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stAlert"]')]
    return headings, metrics, alerts


def _throughput(metrics: dict[str, str]) -> float:
    text = metrics.get("throughput (requests/s)", "-").replace(",", "")
    return float(text) if text not in ("", "-") else 0.0


def test_live_view_shows_the_models_throughput(
    live_dashboard: tuple[str, Path], trickle: list[int], browser: WebDriver, tmp_path: Path
) -> None:
    url, log_path = live_dashboard
    browser.get(url)
    deadline = time.monotonic() + SHOW_TIMEOUT_S
    headings: list[str] = []
    metrics: dict[str, str] = {}
    alerts: list[str] = []
    while True:
        try:
            headings, metrics, alerts = _page_state(browser)
        except StaleElementReferenceException:  # re-rendered between find and read: look again
            continue
        exceptions = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
        assert not exceptions, f"Streamlit exception: {exceptions[0].text}\n{log_path.read_text()}"
        if MODEL in headings and _throughput(metrics) > 0:
            break
        if time.monotonic() > deadline:
            browser.save_screenshot(str(tmp_path / "timeout.png"))
            pytest.fail(
                f"no {MODEL} throughput > 0 on the page in {SHOW_TIMEOUT_S} s ({trickle[0]} requests "
                f"answered): headings {headings}, metrics {metrics}, alerts {alerts}\n{log_path.read_text()}"
            )
        time.sleep(0.25)  # polling the page within a bound
    assert trickle[0] > 0
    assert not [a for a in alerts if "Cannot scrape" in a], alerts
    browser.save_screenshot(str(tmp_path / "dashboard-live.png"))
