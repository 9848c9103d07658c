# lumenrt: one entry point for set-up, tests and checks.
#   make serve   create .venv, build the native core, serve the built-in models (HTTP 8000, gRPC 8001,
#                TCP 8003 on 127.0.0.1; `make serve ARGS="--mode process"` passes flags to lumenrt serve)
#   make test    everything CI runs: C tests (+ ASan/UBSan, TSan builds), ruff, mypy, pytest
PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
# build dependencies are installed into the venv so the package builds without isolation (offline-friendly)
BUILD_DEPS := 'scikit-build-core>=0.10' 'cmake>=3.18' ninja 'grpcio-tools>=1.85.1,<1.86'

# Real clients for the e2e tests and benchmarks. tritonclient 2.51.0 is the last release whose
# perf_analyzer binary runs on this glibc; it pins numpy<2 and protobuf<5, which onnx and our gRPC
# gencode cannot use, so it is installed without its pins and its other needs are listed here.
# perf_analyzer also links libb64 (Debian) and libcudart (nvidia-cuda-runtime-cu12; no GPU needed).
E2E_DEPS := 'python-rapidjson>=0.9.1' 'urllib3>=2.0.7' 'packaging>=14.1' 'aiohttp>=3.8.1,<4' \
            'geventhttpclient>=1.4.4,<=2.0.2' 'nvidia-cuda-runtime-cu12>=12,<13'

.PHONY: all install serve demo test check gpu-check test-native test-sanitize lint typecheck test-python test-unit test-servers test-e2e test-integration bench bench-serve bench-matrix bench-peers bench-latency bench-lane-turn bench-worker-modes bench-grpc-servers bench-security bench-http-body bench-connections bench-shared-memory dashboard report triton-peer clean

all: install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q $(BUILD_DEPS)
	$(BIN)/pip install -q --no-build-isolation -e '.[test,dev,bench,torch,gpu,dashboard,trace]'
	$(BIN)/pip install -q --no-deps tritonclient==2.51.0
	$(BIN)/pip install -q $(E2E_DEPS)
	@ldconfig -p | grep -q libb64.so.0d || (apt-get install -y -q libb64-0d >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libb64-0d >/dev/null 2>&1)) || \
	  echo "note: could not install Debian's libb64-0d: the perf_analyzer e2e tests will be skipped"
	@(command -v chromium >/dev/null && command -v chromedriver >/dev/null) || \
	  (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1)) || \
	  echo "note: could not install Debian's chromium + chromium-driver: the dashboard browser test will be skipped"
	@command -v prometheus >/dev/null || \
	  (apt-get install -y -q prometheus >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q prometheus >/dev/null 2>&1)) || \
	  echo "note: could not install Debian's prometheus: the Prometheus scrape e2e test will be skipped"
	@command -v haproxy >/dev/null || \
	  (apt-get install -y -q haproxy >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q haproxy >/dev/null 2>&1)) || \
	  echo "note: could not install Debian's haproxy: the replicas-behind-a-balancer e2e test will be skipped"
	@$(MAKE) --no-print-directory $(KSERVE_VENV)/bin/python || \
	  echo "note: could not create $(KSERVE_VENV): the KServe SDK e2e tests will be skipped"

# KServe's Python SDK (its InferenceRESTClient and InferenceGRPCClient) for the e2e tests, in a venv of
# its own: it pins protobuf<7, which our gRPC gencode cannot use. The tests run its clients there.
KSERVE_VENV := .venv-kserve
$(KSERVE_VENV)/bin/python:
	$(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/pip install -q kserve==0.21.0 || (rm -rf $(KSERVE_VENV); false)

serve: install
	$(BIN)/lumenrt serve $(ARGS)

demo: install
	$(BIN)/lumenrt demo

# The checks that need no servers (C tests, ruff, mypy, the unit tests) run two at a time, one per
# core; then the integration and e2e tests run alone, since they start servers and measure nothing
# that a neighbour should slow down.
test: install
	$(MAKE) -j2 --output-sync=target test-native test-sanitize lint typecheck test-unit
	$(MAKE) test-servers

check: test

test-native:
	cmake -S native -B build/native -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	env -u MAKEFLAGS cmake --build build/native  # ninja runs its own jobs (no make jobserver)
	ctest --test-dir build/native --output-on-failure

test-sanitize:
	cmake -S native -B build/asan -G Ninja -DLRT_SANITIZE=address,undefined >/dev/null
	env -u MAKEFLAGS cmake --build build/asan
	ctest --test-dir build/asan --output-on-failure
	cmake -S native -B build/tsan -G Ninja -DLRT_SANITIZE=thread >/dev/null
	env -u MAKEFLAGS cmake --build build/tsan
	ctest --test-dir build/tsan --output-on-failure

lint:
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck:
	$(BIN)/mypy

test-python:
	$(BIN)/pytest tests

test-unit:
	$(BIN)/pytest tests/unit

# Two pytest processes at once (the server tests wait on subprocesses much of the time; each names
# its slowest tests, to keep the two halves even: BALANCE moves integration tests to the e2e half),
# then five files alone: test_shm_lifecycle compares every segment in /dev/shm before and after;
# perf_analyzer's runs end only once its measurement windows agree (a neighbour's load kept them
# from agreeing once; the auth and TLS tests run it too); the haproxy test expects haproxy's health
# checks on time.
ALONE_E2E = tests/e2e/test_perf_analyzer.py tests/e2e/test_replicas_haproxy.py tests/e2e/test_auth_serve.py \
            tests/e2e/test_tls_serve.py
BALANCE = tests/integration/test_bench_engine_cli.py
test-servers:
	$(MAKE) -j2 --output-sync=target test-e2e test-integration
	$(BIN)/pytest --durations=10 tests/integration/test_shm_lifecycle.py $(ALONE_E2E)

test-e2e:
	$(BIN)/pytest --durations=15 tests/e2e $(BALANCE) $(addprefix --ignore=,$(ALONE_E2E))

test-integration:
	$(BIN)/pytest --durations=15 tests --ignore=tests/unit --ignore=tests/e2e --ignore=tests/integration/test_shm_lifecycle.py \
	  $(addprefix --ignore=,$(BALANCE))

# Issue 17's GPU run on a machine with a CUDA device: tests/gpu and benchmarks/gpu.py --quick,
# results under $OUT (default results/gpu-check); exits 2 saying why on a machine without CUDA
gpu-check:
	bash benchmarks/gpu_check.sh

# the queue benchmark: native rings vs queue.Queue, multiprocessing.Queue, faster-fifo, pyzmq (~80 s)
bench: install
	$(BIN)/python benchmarks/queues.py $(ARGS)

# The Triton peer of benchmarks/serve.py: Triton 2.51 through PyTriton, in its own venv (it needs
# numpy<2 and protobuf 6, which the project cannot use).
TRITON_VENV := .venv-triton
triton-peer: $(TRITON_VENV)/bin/python
$(TRITON_VENV)/bin/python:
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q nvidia-pytriton==0.7.0 numpy onnxruntime==$$($(BIN)/python -c 'import onnxruntime as o; print(o.__version__)')

bench-serve: install triton-peer
	$(BIN)/python benchmarks/serve.py $(ARGS)

# the architecture table: queue x allocator x worker mode x batch size, each served and loaded (~10 min)
bench-matrix: install
	$(BIN)/lumenrt bench matrix $(ARGS)

# lumenrt against Triton (PyTriton), MLServer and a plain FastAPI endpoint; run.py creates
# .venv-triton, .venv-mlserver and .venv-fastapi itself (~16-18 min; ARGS="--quick" for a smoke run)
bench-peers: install
	$(BIN)/python benchmarks/peers/run.py $(ARGS)

# the small-model request path: c1 round trips against an echo floor and FastAPI, stages,
# allocations per request, throughput, SqueezeNet per protocol (~6 min; creates .venv-fastapi)
bench-latency: install
	$(BIN)/python benchmarks/latency.py $(ARGS)

# the inline lane's budget per event-loop turn (engine.lane_turn_us), 0 against 1000 (~5 min)
bench-lane-turn: install
	$(BIN)/python benchmarks/lane_turn.py $(ARGS)

# worker threads against worker processes (lane queue), digits_mlp TCP and HTTP c1/c8 (~4 min);
# ARGS="--baseline-python P" adds another install's server (e.g. a venv of an earlier commit)
bench-worker-modes: install
	$(BIN)/python benchmarks/worker_modes.py $(ARGS)

# lumenrt's own gRPC server against grpc.aio's, through lumenrt's and grpcio's clients, digits_mlp
# c1/c8 (~3 min)
bench-grpc-servers: install
	$(BIN)/python benchmarks/grpc_servers.py $(ARGS)

# TLS and API keys against a plain server: SqueezeNet HTTP c4, digits_mlp TCP c1/c4, HTTP c4 (~5 min)
bench-security: install
	$(BIN)/python benchmarks/security_overhead.py $(ARGS)

# large HTTP bodies (ARGS="... --protocol grpc": gRPC messages) received into the arena slot,
# against another install (~3 min):
#   make bench-http-body ARGS="--baseline-python /path/to/venv/bin/python"
bench-http-body: install
	$(BIN)/python benchmarks/http_body.py $(ARGS)

# connection density: 10,000 idle HTTP + TCP connections beside a load, and io_uring against uvloop
# (~4.5 min; the io_uring part needs liburing-dev)
bench-connections: install
	$(BIN)/python benchmarks/connections.py $(ARGS)

# system shared memory against tensor bytes in the request: SqueezeNet c1, HTTP and gRPC, and
# perf_analyzer --shared-memory system (~2 min)
bench-shared-memory: install
	$(BIN)/python benchmarks/shared_memory.py $(ARGS)

# the Streamlit dashboard over results/ (http://127.0.0.1:8501), and the same plots as one HTML file
dashboard: install
	$(BIN)/lumenrt dashboard results $(ARGS)

report: install
	$(BIN)/lumenrt bench report results $(ARGS)

clean:
	rm -rf build results .pytest_cache .mypy_cache .ruff_cache
