"""Issue 17: nothing of CUDA is imported or required on a CPU-only path. A fresh interpreter loads
an engine with a CPU model and runs a request: the GPU modules that touch torch or NVML are never
imported (the seam's protocol modules may be, they import numpy only), and neither is torch.cuda
initialized where torch is loaded."""

import json
import subprocess
import sys
from pathlib import Path

CHECK = """
import json, sys
from pathlib import Path
import numpy as np
from lumenrt.engine.engine import Engine, EngineConfig

with Engine(Path(sys.argv[1]), EngineConfig(thread_count=1)) as engine:
    engine.infer("m", {"x": np.ones((1, 2), np.float32)})
    engine.statistics()
torch = sys.modules.get("torch")
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith(("torch", "pynvml", "lumenrt.engine.gpu"))),
    "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
}))
"""


def test_a_cpu_model_imports_nothing_of_cuda_or_nvml(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(
        "class M:\n    def load(self):\n        pass\n\n    def infer(self, inputs):\n        return {'y': inputs['x'] * 2}\n"
    )
    (tmp_path / "m" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 4\ninput: [{name: x, datatype: FP32, dims: [2]}]\n"
        "output: [{name: y, datatype: FP32, dims: [2]}]\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(out.stdout.splitlines()[-1])
    assert found == {"modules": [], "cuda_initialized": False}, found
