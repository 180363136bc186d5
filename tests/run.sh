#!/usr/bin/env bash
# The README's test command (after `bash install.sh`). Runs under the lab's virtual environment
# ($RMSNORM_VENV, default .venv) when it exists, else under $PYTHON (default python3).
# Two pytest processes: interpreted Triton (TRITON_INTERPRET=1) and compiled Triton/CuTe cannot
# share one process. GPU tests run only with `-m gpu` on a GPU machine.
set -euo pipefail
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
"$PY" -m pytest -q -m "not gpu and not interpret and not notebooks" "$@"
TRITON_INTERPRET=1 "$PY" -m pytest -q -m "interpret and not gpu" "$@"
# Every notebook executed on the recorded results, its text outputs compared with the committed
# ones (scripts/notebooks.py: `refresh` brings them up to date).
"$PY" -m pytest -q -p no:cacheprovider -m notebooks tests/test_notebooks.py "$@"
