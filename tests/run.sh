#!/usr/bin/env bash
# The README's test command (after `bash install.sh`). Runs under the lab's virtual environment
# ($RMSNORM_VENV, default .venv) when it exists, else under $PYTHON (default python3).
# Four stages, each its own pytest process (interpreted Triton, TRITON_INTERPRET=1, cannot share
# a process with compiled Triton and CuTe): the library, the workbook, the Triton kernels
# interpreted on the CPU, the notebooks executed on the recorded results. Every stage runs; the
# last lines sum them up, and the exit status is 1 if any failed. Extra arguments go to every
# stage's pytest. GPU tests run only with `pytest -m gpu` on a GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${RMSNORM_VENV:-.venv}
if [ -x "$VENV/bin/python" ]; then
  PY="$VENV/bin/python"
  export PATH="$(cd "$VENV/bin" && pwd):$PATH"  # ninja and jupyter of the environment
else
  PY=${PYTHON:-python3}
fi
echo "[tests] $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
export CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a}
started=$SECONDS
summary=()
failed=0
stage() {  # stage NAME ENV PYTEST-ARGS...
  local name=$1 env=$2 t0=$SECONDS log
  shift 2
  log=$(mktemp)
  echo
  echo "[tests] $name"
  env $env "$PY" -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  local last
  last=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)|no tests ran' "$log" | tail -n 1 \
         | sed -E 's/^=+ //; s/ =+$//')
  rm -f "$log"
  [ "$status" = 0 ] || failed=1
  summary+=("$(printf '%-34s %s %s' "$name" "$([ "$status" = 0 ] && echo ok || echo FAILED)" \
               "(${last:-no summary}; $((SECONDS - t0)) s)")")
}
stage "library (CPU)" "" -m "not gpu and not interpret" tests/library "$@"
stage "workbook (CPU)" "" -m "not gpu and not interpret and not notebooks" tests/workbook "$@"
stage "Triton kernels, interpreted" "TRITON_INTERPRET=1" -m "interpret and not gpu" tests "$@"
# every notebook executed on the recorded results, its text outputs compared with the committed
# ones (scripts/notebooks.py: `refresh` brings them up to date)
stage "notebooks, on recorded results" "" -m notebooks tests/workbook/test_notebooks.py "$@"
echo
echo "[tests] summary"
printf '  %s\n' "${summary[@]}"
echo "[tests] $([ $failed = 0 ] && echo 'all stages passed' || echo 'FAILED') in $((SECONDS - started)) s"
exit $failed
