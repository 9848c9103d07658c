"""``lumenrt bench report``'s arguments, kept apart from the report itself so that building the
``lumenrt`` command line does not import plotly."""

import argparse
import sys

from lumenrt.dashboard.results import MAX_LOAD_RUNS  # numpy only: no plotly


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``lumenrt bench report``."""
    parser.add_argument(
        "results_dir",
        nargs="?",
        default="results",
        metavar="RESULTS_DIR",
        help="folder of result files (default results/)",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        metavar="FILE",
        help="result files (load, matrix or peers JSON; under RESULTS_DIR, else as given) to "
        f"report, in this order (default: every one in RESULTS_DIR, newest first, at most "
        f"{MAX_LOAD_RUNS} load runs)",
    )
    parser.add_argument(
        "--out",
        metavar="PATH",
        help="the HTML file to write (default RESULTS_DIR/report-<UTC stamp>.html)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """``lumenrt bench report``: write the file, print its path; 1 when there was nothing to write."""
    from lumenrt.dashboard.report import write_report
    from lumenrt.dashboard.results import ResultError

    try:
        path = write_report(args.results_dir, args.runs, args.out)
    except ResultError as e:
        print(f"lumenrt bench report: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0
