#!/usr/bin/env bash
# Issue 15's checks on a larger machine (the 16-CPU one): what `lumenrt topology` says of it and
# the plan for the built-in models, the placement tests (threads on their planned cores, memory
# bound and reported local), then benchmarks/placement.py at that machine's scale. Results under
# $OUT when set (a device run's output folder), else results/numa-check:
#   numa.log              topology, the plans (spread and roundrobin), the tests
#   placement-<stamp>.json  the benchmark's result file (its per-run files stay in /tmp)
#
#   bash benchmarks/numa_check.sh [placement.py arguments]   # default: 1 round of 5 s runs
# $PYTHON picks the interpreter (default .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/check_env.sh results/numa-check
log="$OUT/numa.log"
{
  echo "== nproc $(nproc); lscpu"; lscpu 2>/dev/null | head -30
  echo "== lumenrt topology"; "$PY" -m lumenrt.cli topology
  echo "== lumenrt topology --plan (spread, the built-in models)"; "$PY" -m lumenrt.cli topology --plan
  echo "== lumenrt topology --plan --placement roundrobin"; "$PY" -m lumenrt.cli topology --plan --placement roundrobin
} > "$log" 2>&1
timeout 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/unit/test_topology.py tests/unit/test_plan.py \
  tests/integration/test_placement_threads.py tests/integration/test_placement_locality.py \
  tests/integration/test_engine_placement.py >> "$log" 2>&1
tests=$?
echo "== pytest exit $tests" >> "$log"
runs=/tmp/lumenrt-numa-check
mkdir -p "$runs"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--repeats 1 --duration-s 5 --warmup-s 1)
timeout 200 "$PY" benchmarks/placement.py "${args[@]}" --out "$runs" >> "$log" 2>&1
bench=$?
cp "$runs"/placement-*.json "$OUT"/ 2>/dev/null
echo "numa_check: tests exit $tests, benchmark exit $bench (results in $OUT)" | tee -a "$log"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
