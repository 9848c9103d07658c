"""The live view's Streamlit page, headless (``streamlit.testing``), with the scrape answered by a
fake ``urlopen`` (no sockets; the real server and browser are tests/e2e/test_dashboard_live.py)."""

import io
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lumenrt.dashboard

LIVE_APP_PATH = Path(lumenrt.dashboard.__file__).with_name("live_app.py")
URL = "http://127.0.0.1:9/metrics"


def _exposition(requests: int) -> str:
    return (
        f'lumenrt_requests_total{{model="digits_mlp",version="1",protocol="tcp",status="200"}} {requests}\n'
        f'lumenrt_request_duration_seconds_bucket{{model="digits_mlp",version="1",protocol="tcp",le="0.001"}} 0\n'
        f'lumenrt_request_duration_seconds_bucket{{model="digits_mlp",version="1",protocol="tcp",le="0.01"}} {requests}\n'
        f'lumenrt_request_duration_seconds_bucket{{model="digits_mlp",version="1",protocol="tcp",le="+Inf"}} {requests}\n'
        'lumenrt_queue_depth{model="digits_mlp",version="1"} 3\n'
    )


def _app(monkeypatch: pytest.MonkeyPatch, answer: Callable[[], str], url: str = URL) -> Any:
    from streamlit.testing.v1 import AppTest

    def urlopen(target: str, timeout: float) -> io.BytesIO:
        assert target == URL and timeout > 0
        return io.BytesIO(answer().encode())

    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    monkeypatch.setattr("sys.argv", [str(LIVE_APP_PATH), "--url", url])
    return AppTest.from_file(str(LIVE_APP_PATH), default_timeout=60)


def test_live_page_shows_each_models_throughput_after_two_scrapes(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = iter([10, 110, 210])
    app = _app(monkeypatch, lambda: _exposition(next(counts))).run()
    assert not app.exception and not app.warning
    assert [i.value for i in app.info] == ["Waiting for a second scrape to compute rates..."]
    app.run()
    assert not app.exception and not app.warning and not app.info
    assert [h.value for h in app.subheader] == ["digits_mlp"]
    metrics = {m.label: m.value for m in app.metric}
    assert float(metrics["throughput (requests/s)"].replace(",", "")) > 0
    assert metrics["queue depth"] == "3"
    assert metrics["p50 (ms)"] == "5.50"  # 100 requests spread over (1, 10] ms
    assert len(app.get("plotly_chart")) == 3


def test_unreachable_server_is_a_warning_and_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[str | None] = [None, _exposition(1), _exposition(5)]

    def answer() -> str:
        text = answers.pop(0)
        if text is None:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        return text

    app = _app(monkeypatch, answer).run()
    assert not app.exception and not app.error
    assert [w.value for w in app.warning] == [
        f"Cannot scrape {URL}: [Errno 111] Connection refused. Retrying every 1 s."
    ]
    app.run()
    app.run()
    assert not app.exception and not app.warning
    assert [h.value for h in app.subheader] == ["digits_mlp"]


def test_page_that_is_not_metrics_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(monkeypatch, lambda: "<html>hello</html>").run()
    assert not app.exception
    assert len(app.warning) == 1 and "not Prometheus text format" in app.warning[0].value


def test_bad_url_is_an_error_naming_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(monkeypatch, lambda: "", url="ftp://host/metrics").run()
    assert not app.exception
    assert [e.value for e in app.error] == ["--live: 'ftp://host/metrics': the scheme must be http or https"]


def test_launcher_runs_the_live_app_with_the_metrics_url(tmp_path: Path) -> None:
    from lumenrt.dashboard.launch import streamlit_command

    command = streamlit_command(tmp_path, "127.0.0.1", 8600, browser=False, live_url=URL)
    assert command[1:5] == ["-m", "streamlit", "run", str(LIVE_APP_PATH)]
    assert command[-3:] == ["--", "--url", URL]


def test_dashboard_live_refuses_a_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    from lumenrt.cli import main

    assert main(["dashboard", "--live", "ftp://host/metrics", "--no-browser"]) == 2
    assert "--live: 'ftp://host/metrics'" in capsys.readouterr().err
