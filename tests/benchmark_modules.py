"""The scripts and modules of benchmarks/, for the tests that check them.

benchmarks/ is not an installed package: its scripts import each other by plain name (a script's own
folder comes first on sys.path when it runs), so a test that imports one of its modules puts that
folder on sys.path first, as tests/unit/test_peers_table.py does for benchmarks/peers.
"""

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark_module(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported by plain name, as the scripts beside it import it."""
    if str(BENCHMARKS_DIR) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS_DIR))
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").parent == BENCHMARKS_DIR, f"{name} is not benchmarks/{name}.py"
    return module


def run_benchmark_script(name: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<name>.py ARGS`` from the checkout's root, as a user runs it."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS_DIR / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=BENCHMARKS_DIR.parent,
    )
