"""``lumenrt dashboard``: run the Streamlit app (``app.py``) over a results folder as a child,
or with ``--live URL`` the live view of a running server's metrics (``live_app.py``).

The child gets its own process group, so a terminal's Ctrl-C reaches it once, through this
process (which forwards SIGINT and SIGTERM), and this command's exit status is the child's.
Usage statistics and Streamlit's first-run e-mail prompt are off: the command must not wait on
stdin nor talk to the network.
"""

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from lumenrt.extras import require

APP_PATH = Path(__file__).with_name("app.py")
LIVE_APP_PATH = Path(__file__).with_name("live_app.py")
_STOP_WAIT_S = 10.0  # after forwarding a stop: Streamlit closes its sessions within a second or two
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``lumenrt dashboard``."""
    parser.add_argument(
        "results_dir",
        nargs="?",
        default="results",
        metavar="RESULTS_DIR",
        help="folder of result files (default results/)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8501, help="port to listen on (default 8501)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab (run headless)")
    parser.add_argument(
        "--live",
        metavar="URL",
        help="instead of result files, plot a running server's metrics every second: its metrics URL "
        "(http://HOST:PORT/metrics) or base URL (http://HOST:PORT)",
    )


def streamlit_command(
    results_dir: Path, host: str, port: int, browser: bool, live_url: str | None = None
) -> list[str]:
    """The child's command line: ``python -m streamlit run app.py ... -- --results DIR``, or with
    ``live_url`` ``... live_app.py ... -- --url URL``."""
    app, app_args = APP_PATH, ["--results", str(results_dir)]
    if live_url is not None:
        app, app_args = LIVE_APP_PATH, ["--url", live_url]
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "false" if browser else "true",
        "--server.showEmailPrompt",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",  # no "Deploy" button: this is a local viewer of result files
        "--",
        *app_args,
    ]


def url_of(host: str, port: int) -> str:
    """Where a browser on this machine reaches the dashboard."""
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "::" else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def run_from_args(args: argparse.Namespace) -> int:
    """Start the app, print its URL, wait for it; its exit status (128+N when killed by signal N)."""
    root = Path(args.results_dir)
    live_url = None
    if args.live is not None:
        from lumenrt.dashboard.live_metrics import MetricsError, metrics_url

        try:
            live_url = metrics_url(args.live)
        except MetricsError as e:
            print(f"lumenrt dashboard: {e}", file=sys.stderr)
            return 2
    elif not root.is_dir():
        print(
            f"lumenrt dashboard: {root}: no such folder (pass the folder `lumenrt bench ...` wrote "
            "its results into, default results/)",
            file=sys.stderr,
        )
        return 2
    require("dashboard")  # `lumenrt dashboard` checks first; here for callers other than cli.py
    command = streamlit_command(root.resolve(), args.host, args.port, not args.no_browser, live_url)
    child = subprocess.Popen(command, process_group=0)

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    source = root if live_url is None else f"live {live_url}"
    print(f"lumenrt dashboard: {url_of(args.host, args.port)} over {source} (Ctrl-C stops it)", flush=True)
    try:
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:  # we are leaving on an exception: do not leave the server behind
            child.terminate()
            try:
                child.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return status if status >= 0 else 128 - status
