"""The ``lumenrt`` command as a user runs it: the demo, the benchmarks that moved out of the package
(one line naming their script) and the queue benchmark script, benchmarks/queues.py (smoke; its
figures are not judged here), and every command without the extras' modules: its ``--help`` works,
and a command that needs an extra names it in one line."""

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lumenrt import cli
from lumenrt.cli import COMMANDS
from lumenrt.extras import EXTRA_MODULES
from tests.benchmark_modules import BENCHMARKS_DIR, run_benchmark_script

LUMENRT = [sys.executable, "-m", "lumenrt.cli"]


def run(args: list[str], timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LUMENRT + args, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_help_explains_the_commands() -> None:
    out = run(["--help"])
    assert out.returncode == 0 and "demo" in out.stdout and "bench" in out.stdout
    out = run(["bench", "--help"])
    assert out.returncode == 0 and all(f"    {word} " in out.stdout for word in ("load", "matrix", "report"))
    out = run_benchmark_script("queues", ["--help"], timeout_s=60)
    assert out.returncode == 0 and "--json" in out.stdout and "--spin-iters" in out.stdout
    assert "usage: benchmarks/queues.py" in out.stdout


def test_bench_lists_only_the_tools_the_package_ships() -> None:
    bench = {c.words[1] for c in COMMANDS if c.words[0] == "bench"}
    assert bench == {"load", "matrix", "report"}
    assert not bench & {words[1] for words in cli.MOVED}


@pytest.mark.parametrize("word", ["queues", "engine", "stages", "serve"])
def test_moved_benchmark_is_one_line_naming_its_script(word: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", word, "--quick"]) == 2
    script = f"benchmarks/{word}.py"
    assert (BENCHMARKS_DIR.parent / script).is_file()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"lumenrt bench {word}: moved out of the package: run `python {script}` (same arguments) in a "
        "lumenrt checkout\n"
    )


def test_demo_answers_every_request_and_cleans_up() -> None:
    out = run(["demo", "--requests", "3000", "--workers", "2"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3000/3000 answered, 0 wrong" in out.stdout
    assert "shared memory cleaned up" in out.stdout


def test_demo_rejects_bad_arguments() -> None:
    out = run(["demo", "--queue-type", "fifo"])
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_bench_queues_json_rows_and_result_file(tmp_path: Path) -> None:
    out = run_benchmark_script(
        "queues",
        [
            "--quick", "--scale", "0.2", "--json", "--out", str(tmp_path),
            "--scenario", "pair", "--scenario", "handoff-process-waiting", "--scenario", "throughput-2p2c",
            "--impl", "mpmc", "--impl", "naive", "--impl", "queue.Queue", "--impl", "multiprocessing.Queue",
        ],
        timeout_s=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {(r["impl"], r["scenario"]) for r in rows} >= {
        ("mpmc", "pair"),
        ("queue.Queue", "pair"),
        ("mpmc", "handoff-process-waiting"),
        ("multiprocessing.Queue", "handoff-process-waiting"),
        ("mpmc", "throughput-2p2c"),
    }
    for r in rows:
        assert {"impl", "scenario", "p50_ns", "p99_ns", "ops_per_s"} <= r.keys()
    pair = next(r for r in rows if (r["impl"], r["scenario"]) == ("mpmc", "pair"))
    assert pair["syscalls"] == 0  # the busy path made no futex call
    (result,) = tmp_path.glob("queues-*.json")
    doc = json.loads(result.read_text())
    assert doc["machine"]["nproc"] >= 1 and "config" in doc and len(doc["rows"]) == len(rows)


# Runs the `lumenrt` command with the extras' modules made unimportable, as on a plain
# `pip install lumenrt` (tests/e2e/test_plain_install.py checks a real one, built from a wheel).
WITHOUT_EXTRAS = """
import importlib.abc, sys
from lumenrt.extras import EXTRA_MODULES
BLOCKED = {m for modules in EXTRA_MODULES.values() for m in modules}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


def run_without_extras(args: list[str], code: str = "") -> subprocess.CompletedProcess[str]:
    main = code or "from lumenrt.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + main, *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_every_command_help_works_without_extras() -> None:
    out = run_without_extras(["--help"])
    assert out.returncode == 0 and "dashboard" in out.stdout, out.stderr
    for command in COMMANDS:
        out = run_without_extras([*command.words, "--help"])
        assert out.returncode == 0, f"{command.words}: {out.stderr}"
        assert "usage: lumenrt " + " ".join(command.words) in out.stdout


def test_help_imports_only_the_command_it_shows() -> None:
    code = (
        "from lumenrt.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(*sorted(m for m in sys.modules if m.startswith('lumenrt.')), sep='\\n', file=sys.stderr)"
    )
    out = run_without_extras(["dashboard", "--help"], code)
    loaded = out.stderr.split()
    assert "lumenrt.dashboard.launch" in loaded
    others = (
        "lumenrt.bench",
        "lumenrt.ingress",
        "lumenrt.engine",
        "lumenrt.native",
        "lumenrt.dashboard.report",
    )
    assert [m for m in loaded if m.startswith(others)] == []


def test_extra_module_missing_deeper_down_still_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'plotly.subplots'", name="plotly.subplots")

    monkeypatch.setattr(cli, "COMMANDS", (cli.Command(("plot",), "h", "d", lambda p: None, run),))
    assert cli.main(["plot"]) == 2
    assert (
        capsys.readouterr().err
        == "lumenrt plot: needs the 'dashboard' extra: pip install 'lumenrt[dashboard]'\n"
    )


@pytest.mark.parametrize(
    ("args", "name"),
    [(["dashboard"], "lumenrt dashboard"), (["bench", "report", "."], "lumenrt bench report")],
)
def test_missing_extra_is_one_line_naming_it(args: list[str], name: str) -> None:
    out = run_without_extras(args)
    assert out.returncode == 2
    assert out.stderr == f"{name}: needs the 'dashboard' extra: pip install 'lumenrt[dashboard]'\n"


def test_pytorch_backend_without_torch_names_the_extra() -> None:
    code = (
        "from lumenrt.backends.base import get_backend\n"
        "from lumenrt.engine.config import ConfigError\n"
        "get_backend('onnxruntime')\n"
        "try:\n    get_backend('pytorch', 'm/config.yaml')\nexcept ConfigError as e:\n    print(e)"
    )
    out = run_without_extras([], code)
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout
        == "m/config.yaml: backend: 'pytorch' needs the 'torch' extra: pip install 'lumenrt[torch]'\n"
    )


def test_extras_table_matches_pyproject() -> None:
    """extras.EXTRA_MODULES names, for each runtime extra, the modules of exactly the distributions
    that pyproject.toml lists for it; none of them is a core dependency."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}

    by_module = importlib.metadata.packages_distributions()

    def distributions(module: str) -> list[str]:
        """Those providing ``module``; a dotted one (in a namespace package shared by several
        distributions, e.g. ``opentelemetry.sdk``): those whose files hold its folder."""
        if "." not in module:
            return by_module[module]
        folder = module.replace(".", "/") + "/"
        return [
            d.metadata["Name"]
            for d in importlib.metadata.distributions()
            if any(str(f).startswith(folder) for f in d.files or ())
        ]

    for extra, modules in EXTRA_MODULES.items():
        provided = {d.lower().replace("_", "-") for m in modules for d in distributions(m)}
        assert provided == names(project["optional-dependencies"][extra]), extra
        assert not provided & names(project["dependencies"]), extra
