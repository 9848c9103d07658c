#!/usr/bin/env bash
# Issue 12's request-path benchmark (benchmarks/latency.py) on a machine of more CPUs and no package
# registry (the device machine), to tell this project's 2-CPU VM apart from the request path:
#   1. the whole benchmark pinned to 2 CPUs: this VM's shape on a quieter machine (c1 round trips,
#      throughput against FastAPI and the baseline, SqueezeNet), stages and allocations left out;
#   2. SqueezeNet alone on 6 CPUs with 2 server workers, as many as the raw loop's sessions. (Both
#      are set up as 2 workers over all usable CPUs, 3 intra-op threads each, so the event loop and
#      the load generator still share CPUs with them: see docs/results/device-20261127.)
#   3. the GPU tests, when the machine has a CUDA device and time is left (a regression check).
# About 8-9 minutes (measured on this project's 2-CPU VM: 6 minutes for step 1 with --n 5000).
#
#   bash benchmarks/latency_check.sh
#
# Needs beside the checkout (each ignored by git, carried to the device): .whl (lumenrt's missing
# dependencies, see benchmarks/offline_install.sh), .whl-fastapi (fastapi, starlette, pydantic,
# pydantic-core, annotated-types, typing-inspection, uvicorn, opentelemetry-api: the pins of benchmarks/peers/venvs.py)
# and .base-src (`git archive ec1d54b`, the issue's starting commit, for the baseline rows).
# Results go under $OUT when it is set (a device run's output folder), else results/latency-check.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/latency-check}"
LOAD_S="${LOAD_S:-2}"
mkdir -p "$OUT"
quiet=(-q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)

bash benchmarks/offline_install.sh .whl /tmp/site
python3 -m pip install "${quiet[@]}" --target /tmp/fastapi-site .whl-fastapi/*.whl
PYTHONPATH=/tmp/site python3 -m pip install "${quiet[@]}" --no-build-isolation --target /tmp/base-site ./.base-src
for name in base fastapi; do
  printf '#!/bin/sh\nexport PYTHONPATH=/tmp/%s-site:/tmp/site\nexec python3 "$@"\n' "$name" > "/tmp/py-$name"
  chmod +x "/tmp/py-$name"
done
# every interpreter imports what its rows need before any device time goes to the runs
/tmp/py-fastapi -c "import fastapi, uvicorn, onnxruntime, numpy" || { echo "latency_check: FastAPI's wheels are incomplete"; exit 2; }
/tmp/py-base -c "import lumenrt.native._core, lumenrt.protocols.proto.grpc_service_pb2" || { echo "latency_check: the baseline did not build"; exit 2; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)"; python3 --version; git rev-parse HEAD; } > "$OUT/environment.txt" 2>&1 || true

timeout 380 taskset -c 2,3 python3 benchmarks/latency.py --baseline-python /tmp/py-base \
  --fastapi-python /tmp/py-fastapi --n 3000 --load-s "$LOAD_S" --skip stages,alloc --out "$OUT" 2>&1 | tee "$OUT/latency-2cpu.log" || echo "latency.py (2 CPUs): exit $?"
timeout 170 taskset -c 2-7 python3 benchmarks/latency.py --skip rtt,stages,load,alloc --no-fastapi \
  --squeezenet-workers 2 --load-s 1.5 --out "$OUT" 2>&1 | tee "$OUT/squeezenet-6cpu.log" || echo "latency.py (6 CPUs): exit $?"
if ((SECONDS < 450)) && python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/integration/test_engine_gpu.py \
    -k "not process" 2>&1 | tail -15 | tee "$OUT/gpu-tests.log" || true
fi
