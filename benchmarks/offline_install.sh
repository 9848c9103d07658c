#!/usr/bin/env bash
# Install lumenrt from this checkout on a machine with no package registry (an air-gapped GPU
# machine): the wheels it lacks, downloaded elsewhere, then lumenrt itself built here (its native
# core is compiled for this machine's Python), all into one folder put on PYTHONPATH.
#
#   bash benchmarks/offline_install.sh [WHEELS] [TARGET]     # defaults: .whl /tmp/lumenrt-site
#   export PYTHONPATH=/tmp/lumenrt-site
#
# WHEELS: the missing packages as wheels for that machine's Python, fetched where pip works, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#       httptools hdrhistogram 'grpcio-tools>=1.85.1,<1.86' 'grpcio>=1.85.1' 'protobuf>=7.35.1,<8' xgboost-cpu
# (the GPU machine of issue 17 had every other dependency: numpy, onnx, onnxruntime, torch, ...).
# The build needs scikit-build-core, CMake, Ninja and the Python headers on that machine.
# $PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS="${1:-.whl}"
TARGET="${2:-/tmp/lumenrt-site}"
pip_quiet=(-q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PY" -m pip install "${pip_quiet[@]}" --upgrade --target "$TARGET" "$WHEELS"/*.whl
fi
export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pip install "${pip_quiet[@]}" --no-build-isolation --upgrade --target "$TARGET" .
"$PY" -c "import lumenrt.native._core, lumenrt.protocols.proto.grpc_service_pb2; print('lumenrt installed in $TARGET')"
