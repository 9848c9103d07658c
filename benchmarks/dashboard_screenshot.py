"""Screenshots of ``lumenrt dashboard`` over a results folder, in headless Chromium (for the README).

    .venv/bin/python benchmarks/dashboard_screenshot.py results docs/dashboard \\
        --views "Single run" "Architecture matrix" "Peers"

Starts the dashboard on a free loopback port, opens each view in Debian's chromium (selenium +
chromedriver), waits until its plots are drawn, and writes ``<prefix>-<view>.png``. Stops the
dashboard when done.
"""

import argparse
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

START_TIMEOUT_S = 60.0
RENDER_TIMEOUT_S = 90.0
SETTLE_S = 2.0  # after the plots appear: let plotly finish its transitions before the shot


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the dashboard did not start")


def _view_options(driver: webdriver.Chrome) -> list[Any]:
    """The sidebar's view radio options, once the app has drawn them."""
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while time.monotonic() < deadline:
        found = driver.find_elements(
            By.CSS_SELECTOR, '[data-testid="stSidebar"] [data-testid="stRadioOption"]'
        )
        if found:
            return list(found)
        time.sleep(0.25)
    raise RuntimeError(f"the sidebar's views did not appear in {RENDER_TIMEOUT_S} s")


def _shoot(driver: webdriver.Chrome, view: str, path: Path, min_plots: int) -> None:
    for option in _view_options(driver):
        if option.text.strip() == view:
            option.click()
            break
    else:
        raise RuntimeError(f"no view {view!r}")
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while time.monotonic() < deadline:
        heading = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMain"] h1')
        plots = driver.find_elements(By.CSS_SELECTOR, '[data-stale="false"] .js-plotly-plot')
        if heading and heading[0].text.strip() == view and len(plots) >= min_plots:
            break
        time.sleep(0.25)
    else:
        raise RuntimeError(f"view {view!r}: plots not drawn in {RENDER_TIMEOUT_S} s")
    time.sleep(SETTLE_S)
    driver.save_screenshot(str(path))
    print(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="results folder")
    p.add_argument("prefix", help="output path prefix: writes <prefix>-<view>.png")
    p.add_argument("--views", nargs="+", default=["Single run", "Architecture matrix", "Peers"])
    p.add_argument("--size", default="1600,2200", help="window size WIDTH,HEIGHT (default 1600,2200)")
    args = p.parse_args(argv)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lumenrt.cli", "dashboard", args.results, "--port", str(port), "--no-browser"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_healthy(url, proc)
        options = Options()
        options.binary_location = "/usr/bin/chromium"
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            f"--window-size={args.size}",
        ):
            options.add_argument(arg)
        driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
        try:
            driver.get(url)
            for view in args.views:
                slug = view.lower().replace(" ", "-")
                _shoot(driver, view, Path(f"{args.prefix}-{slug}.png"), min_plots=1)
        finally:
            driver.quit()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
