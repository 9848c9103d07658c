"""``lumenrt dashboard --live`` against a real ``lumenrt serve``, read by real headless Chromium.

The test starts the server (built-in models, port 0), sends a bounded trickle of digits_mlp
requests over HTTP from a thread, starts ``python -m lumenrt.cli dashboard --live
http://127.0.0.1:PORT --port P --no-browser`` (the base URL: the page scrapes ``/metrics``), and
waits until the page shows the model's name and a throughput above 0 requests/s. Teardown stops
the dashboard with SIGTERM (exit status 0) and the server (exit status 0).
"""

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from lumenrt.client.http import HttpClient
from lumenrt.dashboard.live_app import model_key
from lumenrt.models.builtin import builtin_examples
from tests.e2e.conftest import ServeProcess, start_serve
from tests.e2e.streamlit_process import chromium, dashboard_process, http_status, needs_chromium

MODEL = "digits_mlp"
SHOW_TIMEOUT_S = 90.0  # two scrapes (1 s apart) plus a Streamlit rerun in software-rendered Chromium
TRICKLE_MAX_REQUESTS = 3000  # bounded: 20 requests/s for the longest the test can wait
TRICKLE_GAP_S = 0.05

pytestmark = needs_chromium


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
    status = http_status(base + "/metrics")
    if status != 200:
        pytest.fail(f"lumenrt serve does not serve GET /metrics (got {status}): the live view needs it")
    log_path = tmp_path / "dashboard.log"
    with dashboard_process(["--live", base], log_path) as url:
        assert f"live {base}/metrics" in log_path.read_text()  # the launcher said what it scrapes
        yield url, log_path


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


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
