#!/usr/bin/env bash
# Issue 17's GPU run on a machine with a CUDA device (run on an H100: docs/results/device-20261126b):
# the CUDA tests, then the short GPU benchmark. About 5-8 minutes (estimated). Results go under
# $OUT when it is set (a device run's output folder), else results/gpu-check:
#   environment.txt   nvidia-smi, torch and CUDA versions
#   gpu-tests.log     pytest tests/gpu (+ the fake-device tests, as a control)
#   gpu-bench.log, gpu-<stamp>.json benchmarks/gpu.py --quick (machine, commit, config, rows, ratios)
#
#   bash benchmarks/gpu_check.sh                    # or: make gpu-check
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh
#
# Needs a Python ($PYTHON, default .venv/bin/python, else python3) where `import torch` is a CUDA
# build and `import lumenrt` works with its native core built; the script checks both first and
# says which is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/check_env.sh results/gpu-check

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
  nvidia-smi || echo "nvidia-smi: not found"
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())"
  "$PY" -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
  "$PY" -c "import pynvml; print('nvidia-ml-py: installed')" 2>/dev/null || echo "nvidia-ml-py: not installed (no NVML figures)"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: $PY has no CUDA-enabled torch (see $OUT/environment.txt): nothing was run" | tee -a "$OUT/environment.txt"
  exit 2
fi
if ! "$PY" -c "import lumenrt.native._core" 2>/dev/null; then
  echo "gpu_check: $PY cannot import lumenrt with its native core (pip install -e . there first): nothing was run" | tee -a "$OUT/environment.txt"
  exit 2
fi

timeout 240 "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu tests/unit/test_gpu_pipeline.py \
  tests/integration/test_engine_gpu.py 2>&1 | tee "$OUT/gpu-tests.log"
tests=${PIPESTATUS[0]}
timeout 270 "$PY" benchmarks/gpu.py --quick --out "$OUT" 2>&1 | tee "$OUT/gpu-bench.log"
bench=${PIPESTATUS[0]}
echo "gpu_check: tests exit $tests, benchmark exit $bench (results in $OUT)"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
