"""A plain install: the wheel built from this checkout, installed with no extras into a fresh venv
(not this one, no system site-packages), serves a built-in model and answers an inference over
HTTP; the load generator runs; commands that need an extra say which one in one line.

The wheel is built once per module with this venv's build dependencies (scikit-build-core, cmake,
ninja, grpcio-tools; no build isolation) in the checkout's own build folder (``build/{wheel_tag}``,
where ``make install`` built the editable install: the native code is not compiled again), and
installed with pip's ordinary index (PyPI, or whatever pip is configured with): this test needs it
to fetch the core dependencies, and fails saying so when it cannot. pip's cache makes reruns fast.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lumenrt.bench.serve_process import ServeProcess, start_serve
from lumenrt.extras import EXTRA_MODULES
from lumenrt.native import SHM_PREFIX, leftover_segments

REPO_ROOT = Path(__file__).resolve().parents[2]
# Generous limits (guessed, several times what this machine took): a cold native + gRPC build on
# 2 cores, and a cold pip cache downloading the core dependencies (xgboost alone brings ~300 MB).
BUILD_TIMEOUT_S = 900
INSTALL_TIMEOUT_S = 1200
COMMAND_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
# Modules that only the test and dev extras bring: absent from a plain install too.
TOOL_MODULES = ("pytest", "hypothesis", "selenium", "mypy", "ruff")


@dataclass
class PlainInstall:
    root: Path  # a scratch folder: the commands run in it
    bin: Path  # the fresh venv's bin folder
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "lumenrt"), *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def _step(what: str, cmd: list[str], timeout_s: float, hint: str = "") -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what}: no result after {timeout_s:g} s{hint}: {' '.join(cmd)}\n{exc.output or ''}")
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-40:])
        pytest.fail(f"{what} failed (exit {out.returncode}){hint}: {' '.join(cmd)}\n{tail}")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlainInstall]:
    """The fresh venv, removed afterwards (about 1.2 GB: pytest keeps its last three temp folders)."""
    root = tmp_path_factory.mktemp("plain-install")
    wheels = root / "wheels"
    _step(
        "building the wheel",
        [
            sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
            "-w", str(wheels), str(REPO_ROOT),
        ],
        BUILD_TIMEOUT_S,
    )  # fmt: skip
    (wheel,) = wheels.glob("lumenrt-*.whl")
    venv = root / "venv"
    _step("creating a venv", [sys.executable, "-m", "venv", str(venv)], COMMAND_TIMEOUT_S)
    _step(
        "pip install of the wheel (no extras)",
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        INSTALL_TIMEOUT_S,
        hint=" (this test needs PyPI, or the index pip is configured with, for the core dependencies)",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["LUMENRT_CACHE_DIR"] = str(root / "cache")  # the built-in models are built here, not in ~/.cache
    work = root / "work"
    work.mkdir()
    yield PlainInstall(work, venv / "bin", env)
    shutil.rmtree(root, ignore_errors=True)


def test_the_install_is_plain(plain: PlainInstall) -> None:
    modules = [m for provided in EXTRA_MODULES.values() for m in provided] + list(TOOL_MODULES)
    code = (
        "import importlib.util, sys, lumenrt\n"
        "print(lumenrt.__file__)\n"
        "print(*[m for m in sys.argv[1:] if importlib.util.find_spec(m.partition('.')[0])])"
    )
    out = subprocess.run(
        [str(plain.bin / "python"), "-c", code, *modules],
        cwd=plain.root,
        env=plain.env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=True,
    )
    where, installed = out.stdout.splitlines()
    assert Path(where).is_relative_to(plain.bin.parent), where  # the wheel's copy, not this checkout's
    assert installed == "", f"a plain install brought extras' modules: {installed}"


@pytest.mark.parametrize("args", [[], ["serve"], ["bench", "load"], ["dashboard"]])
def test_help_works(plain: PlainInstall, args: list[str]) -> None:
    out = plain.run(*args, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: lumenrt"), out.stdout


@pytest.mark.parametrize(
    ("args", "name"), [(["dashboard"], "lumenrt dashboard"), (["bench", "report"], "lumenrt bench report")]
)
def test_command_without_its_extra_names_it(plain: PlainInstall, args: list[str], name: str) -> None:
    out = plain.run(*args)
    assert out.returncode == 2
    assert out.stderr == f"{name}: needs the 'dashboard' extra: pip install 'lumenrt[dashboard]'\n"


def test_pytorch_model_without_torch_names_the_extra(plain: PlainInstall) -> None:
    model = plain.root / "torch-repo" / "tiny"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.pt2").write_bytes(b"")
    (model / "config.yaml").write_text(
        "backend: pytorch\nmax_batch_size: 4\n"
        "input:\n- {name: x, datatype: FP32, dims: [2]}\noutput:\n- {name: y, datatype: FP32, dims: [2]}\n"
    )
    out = plain.run(
        "serve", "--repository", str(model.parent),
        "--http-port", "0", "--grpc-port", "off", "--tcp-port", "off",
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "backend: 'pytorch' needs the 'torch' extra: pip install 'lumenrt[torch]'" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture
def served(plain: PlainInstall) -> Iterator[ServeProcess]:
    """``lumenrt serve`` of the plain install: digits_mlp, every front end on a free port."""
    server = start_serve(
        "--models", "digits_mlp", "--workers", "1",
        command=[str(plain.bin / "lumenrt")], env=plain.env, cwd=plain.root,
    )  # fmt: skip
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.stop(STOP_TIMEOUT_S)
        assert leftover_segments(f"{SHM_PREFIX}{server.proc.pid}.") == []


def test_plain_install_serves_a_builtin_model(plain: PlainInstall, served: ServeProcess) -> None:
    pixels = [float((i * 7) % 17) for i in range(2 * 64)]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 64], "data": pixels}]}
    request = urllib.request.Request(
        f"http://127.0.0.1:{served.ports['http']}/v2/models/digits_mlp/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        outputs = {o["name"]: o for o in json.load(response)["outputs"]}
    assert outputs["probabilities"]["shape"] == [2, 10]
    assert outputs["label"]["shape"] == [2]
    for row in range(2):
        assert sum(outputs["probabilities"]["data"][row * 10 : row * 10 + 10]) == pytest.approx(1, abs=1e-4)

    # the load generator works on core dependencies too (HdrHistogram is one)
    load = plain.run(
        "bench", "load", "--target", f"tcp://127.0.0.1:{served.ports['tcp']}", "--model", "digits_mlp",
        "--metadata-url", f"127.0.0.1:{served.ports['http']}", "--requests", "200", "--warmup-s", "0.2",
        "--out", str(plain.root / "results"), "--json", "--quiet",
    )  # fmt: skip
    assert load.returncode == 0, load.stderr
    counts = json.loads(load.stdout)["counts"]
    assert counts["sent"] == counts["ok"] == 200, counts

    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(STOP_TIMEOUT_S) == 0, "\n".join(served.lines)
