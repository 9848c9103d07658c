# lumenrt: one entry point for set-up, tests and checks.
#   make serve   create .venv, build the native core, run the demo (the server comes with the engine)
#   make test    everything CI runs: C tests (+ ASan/UBSan, TSan builds), ruff, mypy, pytest
PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
# build dependencies are installed into the venv so the package builds without isolation (offline-friendly)
BUILD_DEPS := scikit-build-core>=0.10 cmake>=3.18 ninja

.PHONY: all install serve demo test check test-native test-sanitize lint typecheck test-python bench clean

all: install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q $(BUILD_DEPS)
	$(BIN)/pip install -q --no-build-isolation -e '.[test,dev,bench,torch]'

serve demo: install
	$(BIN)/lumenrt demo

test: install test-native test-sanitize lint typecheck test-python

check: test

test-native:
	cmake -S native -B build/native -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build/native
	ctest --test-dir build/native --output-on-failure

test-sanitize:
	cmake -S native -B build/asan -G Ninja -DLRT_SANITIZE=address,undefined >/dev/null
	cmake --build build/asan
	ctest --test-dir build/asan --output-on-failure
	cmake -S native -B build/tsan -G Ninja -DLRT_SANITIZE=thread >/dev/null
	cmake --build build/tsan
	ctest --test-dir build/tsan --output-on-failure

lint:
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck:
	$(BIN)/mypy

test-python:
	$(BIN)/pytest tests

bench: install
	$(BIN)/lumenrt bench queues

clean:
	rm -rf build results .pytest_cache .mypy_cache .ruff_cache
