"""Layering: the clients load only ``lumenrt.client`` and ``lumenrt.protocols``; the protocol codecs
load nothing from the server, the engine or the clients.

Each import runs in a fresh interpreter, so what this test process has already imported does not
count; the sources are also read for ``lumenrt`` imports, which catches imports inside functions.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lumenrt.client
import lumenrt.protocols


def _loaded_lumenrt_modules(*modules: str) -> set[str]:
    """Import ``modules`` in a fresh interpreter; return the ``lumenrt`` modules it then holds."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'lumenrt' or m.startswith('lumenrt.'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert set(modules) <= loaded  # the imports really happened
    return loaded


def _under(loaded: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages))


def test_client_loads_no_server_engine_or_bench() -> None:
    loaded = _loaded_lumenrt_modules("lumenrt.client")
    assert "lumenrt.protocols.tcp" in loaded
    assert _under(loaded, ("lumenrt.server", "lumenrt.engine", "lumenrt.bench")) == []


def test_protocols_load_no_server_engine_or_client() -> None:
    loaded = _loaded_lumenrt_modules("lumenrt.protocols.tcp", "lumenrt.protocols.dtypes")
    assert _under(loaded, ("lumenrt.server", "lumenrt.engine", "lumenrt.client")) == []


def _lumenrt_imports(path: Path) -> list[str]:
    """Every ``lumenrt`` module a source file imports, at any depth (functions included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.append(node.module or "")
    return [n for n in names if n == "lumenrt" or n.startswith("lumenrt.")]


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        (lumenrt.client, ("lumenrt.client", "lumenrt.protocols")),
        (lumenrt.protocols, ("lumenrt.protocols",)),
    ],
    ids=["client", "protocols"],
)
def test_sources_import_only_allowed_lumenrt_packages(package: object, allowed: tuple[str, ...]) -> None:
    files = sorted(Path(str(getattr(package, "__file__", ""))).parent.glob("*.py"))
    assert files
    bad = {
        f.name: outside
        for f in files
        if (outside := [n for n in _lumenrt_imports(f) if not _under({n}, allowed)])
    }
    assert bad == {}
