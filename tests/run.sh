#!/usr/bin/env bash
# The README's test command. Two pytest processes: interpreted Triton (TRITON_INTERPRET=1) and
# compiled Triton/CuTe cannot share one process. GPU tests run only with `-m gpu` on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a}
python3 -m pytest -q -m "not gpu and not interpret" "$@"
TRITON_INTERPRET=1 python3 -m pytest -q -m "interpret and not gpu" "$@"
# Every notebook, headless, on the recorded results (or live on a GPU).
python3 -m pytest -q -p no:cacheprovider --nbmake notebooks/
