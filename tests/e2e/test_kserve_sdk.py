"""KServe's Python SDK (``kserve`` on PyPI, in .venv-kserve) as a client of ``lumenrt serve`` (#16):
``InferenceRESTClient`` (V2: health, model readiness, infer with nested JSON data as KServe's own
e2e tests send it, FP32 [2, 4], and with the binary tensor extension) and ``InferenceGRPCClient``
(health, readiness, infer). The SDK runs in its own interpreter (tests/e2e/kserve_client.py)."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import start_serve

ROOT = Path(__file__).parents[2]
KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not KSERVE_PYTHON.exists(), reason="no .venv-kserve (make install creates it: pip install kserve)"
)
MODEL = "iris-like"
CONFIG = """
backend: python
max_batch_size: 8
input: [{name: input-0, datatype: FP32, dims: [4]}]
output: [{name: output-0, datatype: FP32, dims: [4]}]
"""
CODE = """
class Model:
    def load(self):
        pass

    def infer(self, inputs):
        return {"output-0": inputs["input-0"] * 2}
"""
DATA = [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]]


@pytest.mark.parametrize("layout", ["repository", "model-dir"])
def test_kserve_rest_and_grpc_clients(tmp_path: Path, layout: str) -> None:
    """``repository``: a lumenrt repository (as the ClusterServingRuntime's --repository=/mnt/models
    takes it); ``model-dir``: one model's files as KServe's storage initializer leaves them in
    /mnt/models, served with --model-dir and --model-name."""
    if layout == "repository":
        (tmp_path / MODEL / "1").mkdir(parents=True)
        (tmp_path / MODEL / "config.yaml").write_text(CONFIG)
        (tmp_path / MODEL / "1" / "model.py").write_text(CODE)
        flags = ["--repository", str(tmp_path)]
    else:
        mounted = tmp_path / "mnt" / "models"
        mounted.mkdir(parents=True)
        (mounted / "config.yaml").write_text(CONFIG)
        (mounted / "model.py").write_text(CODE)
        flags = ["--model-dir", str(mounted), "--model-name", MODEL]
    with start_serve(*flags) as server:
        run = subprocess.run(
            [str(KSERVE_PYTHON), str(ROOT / "tests" / "e2e" / "kserve_client.py"),
             f"http://{server.http_url}", server.grpc_url, MODEL],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout.strip().splitlines()[-1])
    expected = (np.array(DATA, dtype=np.float32) * 2).tolist()
    rest, grpc = got["rest"], got["grpc"]
    assert (rest["live"], rest["ready"], rest["model_ready"]) == (True, True, True)
    assert rest["json"]["output-0"][:2] == [[2, 4], "FP32"]
    assert np.allclose(np.array(rest["json"]["output-0"][2], dtype=np.float32).reshape(2, 4), expected)
    assert rest["binary"]["output-0"][:2] == [[2, 4], "FP32"]
    assert np.allclose(rest["binary"]["output-0"][2], expected)
    assert "400" in rest["bad_input"] and "nope" in rest["bad_input"]  # the field named
    assert (grpc["live"], grpc["ready"], grpc["model_ready"]) == (True, True, True)
    assert grpc["infer"]["output-0"][:2] == [[2, 4], "FP32"]
    assert np.allclose(grpc["infer"]["output-0"][2], expected)
