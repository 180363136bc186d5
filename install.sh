#!/usr/bin/env bash
# One-command install: keeps an existing torch (a GPU user's CUDA build is never replaced); on a
# machine without torch it installs torch 2.13.0 (the CPU build on our CPU and CI machines).
# Then installs the lab in editable mode with its test tools.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[test]"
"$PY" -c "import rmsnorm_lab, torch; print('rmsnorm_lab', rmsnorm_lab.__version__, '| torch', torch.__version__)"
