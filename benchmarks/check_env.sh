# Sourced by gpu_check.sh and numa_check.sh (from the repository root): OUT, the results folder
# ($OUT when set, as on a device run, else the first argument), made; PY, the interpreter
# ($PYTHON, else .venv/bin/python, else python3).
OUT="${OUT:-$1}"
mkdir -p "$OUT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
