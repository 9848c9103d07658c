"""``lumenrt dashboard`` as a real process, driven by real headless Chromium (selenium).

The test writes a small results folder, starts ``python -m lumenrt.cli dashboard DIR --port P
--no-browser``, waits for the plotly plots of each view (single run, compare runs, architecture
matrix, peers) to render, and requires no Streamlit exception and no error alert in any. It
saves a screenshot of the single-run view under tmp_path and, if LUMENRT_DASHBOARD_SCREENSHOT is
set, to that path too. Teardown stops the dashboard with SIGTERM and requires exit status 0 (the
launcher forwards the signal to Streamlit).
"""

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from tests.dashboard_fixtures import FixtureResults, write_results
from tests.e2e.streamlit_process import chromium, dashboard_process, needs_chromium

RENDER_TIMEOUT_S = 90.0  # per view: a Streamlit rerun plus plotly drawing in software-rendered Chromium

pytestmark = needs_chromium

T = TypeVar("T")


@dataclass
class Dashboard:
    url: str
    results: FixtureResults
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    results = write_results(tmp_path / "results")
    (results.root / "junk.json").write_text("{ not json")  # a bad file must not break a view
    log_path = tmp_path / "dashboard.log"
    with dashboard_process([str(results.root)], log_path) as url:
        board = Dashboard(url=url, results=results, log_path=log_path)
        assert board.url in board.log()  # the launcher printed where it listens
        yield board


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def _wait(what: str, check: Callable[[], T | None], board: Dashboard, driver: WebDriver) -> T:
    """Poll ``check`` until it returns a truthy value, for at most RENDER_TIMEOUT_S. An element that
    Streamlit re-rendered between being found and being read counts as not there yet."""
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while True:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            shot = board.log_path.with_name("timeout.png")
            driver.save_screenshot(str(shot))
            pytest.fail(
                f"timed out after {RENDER_TIMEOUT_S} s waiting for {what} (screenshot {shot}):\n{board.log()}"
            )
        time.sleep(0.25)


def _plot_titles(driver: WebDriver) -> list[str]:
    """The titles of the plotly plots on the page that are drawn (not stale from a previous view)."""
    titles = []
    for plot in driver.find_elements(By.CSS_SELECTOR, '[data-stale="false"] .js-plotly-plot'):
        titles += [t.text for t in plot.find_elements(By.CSS_SELECTOR, ".gtitle")]
    return titles


def _await_view(driver: WebDriver, board: Dashboard, view: str, titles: list[str]) -> None:
    """Wait until the main area shows ``view`` with a drawn plot for each of ``titles`` (prefixes)."""

    def ready() -> bool:
        headings = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMain"] h1')
        if not headings or headings[0].text.strip() != view:
            return False
        drawn = _plot_titles(driver)
        return all(any(d.startswith(t) for d in drawn) for t in titles)

    _wait(f"the {view} view with plots {titles}", ready, board, driver)
    _assert_no_errors(driver, board)


def _assert_no_errors(driver: WebDriver, board: Dashboard) -> None:
    exceptions = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not exceptions, f"Streamlit exception: {exceptions[0].text}\n{board.log()}"
    errors = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')
    alerts = [a.text for a in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stAlert"]')]
    assert not errors, f"error alert: {errors[0].text}"
    assert not [a for a in alerts if "Error" in a], f"alert mentioning an error: {alerts}"


def _pick_view(driver: WebDriver, view: str) -> None:
    options = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebar"] [data-testid="stRadioOption"]')
    for option in options:
        if option.text.strip() == view:
            option.click()
            return
    pytest.fail(f"no sidebar option {view!r} among {[o.text for o in options]}")


def _add_run(driver: WebDriver, name: str) -> None:
    """Type a run's name into the sidebar's run picker and take the first match."""
    box = driver.find_element(
        By.CSS_SELECTOR, '[data-testid="stSidebar"] [data-testid="stMultiSelect"] input'
    )
    box.click()
    box.send_keys(name)
    box.send_keys(Keys.ENTER)
    box.send_keys(Keys.ESCAPE)


def test_dashboard_renders_every_view(dashboard: Dashboard, browser: WebDriver, tmp_path: Path) -> None:
    newest, older = dashboard.results.load_names
    started = time.monotonic()
    browser.get(dashboard.url)

    # the newest run (open loop, no server stages): 4 plots
    _await_view(
        browser,
        dashboard,
        "Single run",
        [
            f"Latency over time (µs): {newest}",
            f"Throughput over time (requests/s, per 1 s): {newest}",
            f"Latency percentiles (µs): {newest}",
            f"Latency CDF (µs): {newest}",
        ],
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) >= 4
    shot = tmp_path / "dashboard-single-run.png"
    assert browser.save_screenshot(str(shot))
    if os.environ.get("LUMENRT_DASHBOARD_SCREENSHOT"):
        target = Path(os.environ["LUMENRT_DASHBOARD_SCREENSHOT"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)

    _pick_view(browser, "Compare runs")
    _wait(
        "the hint to pick a second run",
        lambda: any(
            "two or more" in a.text for a in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlert"]')
        ),
        dashboard,
        browser,
    )
    _add_run(browser, older)
    _await_view(
        browser,
        dashboard,
        "Compare runs",
        [
            "Latency CDF (µs)",
            "Latency percentiles by run",
            "Throughput by run (requests/s)",
            "Throughput over time by run",
            "Mean time per stage (µs)",
        ],
    )
    browser.save_screenshot(str(tmp_path / "dashboard-compare.png"))

    _pick_view(browser, "Architecture matrix")
    _await_view(
        browser, dashboard, "Architecture matrix", ["Architecture matrix (requests/s, µs): squeezenet"]
    )
    assert "mpmc/lumen_arena/thread w2 b8" in browser.page_source  # the table
    browser.save_screenshot(str(tmp_path / "dashboard-matrix.png"))

    _pick_view(browser, "Peers")
    _await_view(browser, dashboard, "Peers", ["Peers: throughput (requests/s) and p99 (µs)"])
    browser.save_screenshot(str(tmp_path / "dashboard-peers.png"))

    elapsed_s = time.monotonic() - started
    print(f"dashboard: four views rendered in {elapsed_s:.1f} s; screenshots in {tmp_path}")
