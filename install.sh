#!/usr/bin/env bash
# Sets up the lab in a virtual environment and builds its native part. Run it again at any time:
# it reuses what is there. docs/install.md says what it downloads and how long it takes.
#
# (Its own variables are RMSNORM_*, not RMSNORM_LAB_*: the lab warns about RMSNORM_LAB_* names it
# does not know, and ignores them.)
#
#   1. The virtual environment: $RMSNORM_VENV (default .venv beside this file), reused when
#      present, else created with $PYTHON (default python3; 3.11 or newer).
#   2. torch. A GPU build of torch (CUDA or ROCm) that the given Python already has is KEPT: the
#      new environment sees that Python's packages (a .pth file, as --system-site-packages does)
#      and pip is told that torch and its triton must stay at the installed versions, so nothing
#      replaces them and nothing of that Python changes. Otherwise, when the environment has no
#      torch (or a CPU build other than the tested one):
#        - with an NVIDIA GPU (nvidia-smi sees one): torch from the default index (on Linux x86_64
#          PyPI's torch is the CUDA build);
#        - without one: the CPU build from PyTorch's CPU index ($RMSNORM_TORCH_CPU_INDEX,
#          default https://download.pytorch.org/whl/cpu), asked with a 10 s timeout; when it
#          cannot be reached or has no wheel for this platform, the default index.
#   3. The lab, editable, with its test tools, under the tested versions (.ci/constraints.txt,
#      merged with any files in $PIP_CONSTRAINT, which win; a kept GPU torch overrides both).
#      The constraints applied are written to <venv>/constraints.txt.
#   4. The native autograd node (C++, rmsnorm_lab/native/), built once with the machine's C++
#      compiler and cached by torch in <venv>/torch_extensions (the environment's python sets
#      TORCH_EXTENSIONS_DIR there unless it is set); without a compiler the lab uses its Python
#      node.
#
# Its own lines start with [install]. pip's output (hundreds of lines) goes to <venv>/pip.log;
# when pip fails, the last lines of that log are shown and the install stops.
set -euo pipefail
CALLER_PWD=$PWD
cd "$(dirname "$0")"
ROOT=$PWD
VENV=${RMSNORM_VENV:-.venv}
BASE_PY=${PYTHON:-python3}
CPU_INDEX=${RMSNORM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
HELPER="$ROOT/scripts/install_helper.py"
TESTED="$ROOT/.ci/constraints.txt"

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }
started=$SECONDS

# --- 1. the virtual environment ------------------------------------------------------------
PY="$VENV/bin/python"
if [ -e "$PY" ]; then
  "$PY" -c "import sys; assert sys.version_info >= (3, 11)" 2>/dev/null \
    || die "$VENV exists but its python does not run or is older than 3.11; remove it (rm -rf $VENV) and run this again"
  say "reusing the virtual environment $VENV ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
else
  command -v "$BASE_PY" >/dev/null 2>&1 || die "no $BASE_PY on PATH; set PYTHON=/path/to/python3.11+"
  "$BASE_PY" -c "import sys; assert sys.version_info >= (3, 11)" 2>/dev/null \
    || die "$BASE_PY is Python $("$BASE_PY" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo '?'); the lab needs 3.11 or newer: set PYTHON=/path/to/python3.11+"
  say "creating the virtual environment $VENV with $(command -v "$BASE_PY") ($("$BASE_PY" -c 'import sys; print(sys.version.split()[0])'))"
  "$BASE_PY" -m venv "$VENV" \
    || die "python -m venv failed (on Debian/Ubuntu: apt-get install python3-venv); remove $VENV and run this again"
  base_torch=$("$BASE_PY" "$HELPER" torch)
  case "$base_torch" in
    cuda\ *|rocm\ *)
      set -- $base_torch
      site=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
      "$BASE_PY" "$HELPER" link "$site"
      say "keeping your torch $2 ($1 $3) of $BASE_PY: $VENV sees that Python's packages and nothing replaces them"
      ;;
  esac
fi
# the environment ignores itself in git (as virtualenv's do), so it is never committed
[ -e "$VENV/.gitignore" ] || printf '*\n' > "$VENV/.gitignore"
VENV_ABS=$(cd "$VENV" && pwd)
# torch's cache of built extensions (the native node) inside the environment, for every process
# of it (scripts, notebooks, tests): two checkouts of the lab on one machine would otherwise
# share one build folder per torch version and rebuild it from each other's sources
"$PY" - "$VENV_ABS/torch_extensions" <<'EOF'
import sys, sysconfig
from pathlib import Path
line = f"import os; os.environ.setdefault('TORCH_EXTENSIONS_DIR', {sys.argv[1]!r})\n"
Path(sysconfig.get_path("purelib"), "_rmsnorm_lab_env.pth").write_text(line)
EOF
export PATH="$VENV_ABS/bin:$PATH"  # ninja (the native build) and jupyter of the environment

# pip's output, this run's, for when something goes wrong: the [install] lines tell the story
PIP_LOG="$VENV/pip.log"
: > "$PIP_LOG"
pip_logged() {  # pip_logged ARGS...: pip install ARGS, its output appended to $PIP_LOG
  printf '\n$ pip install %s\n' "$*" >> "$PIP_LOG"
  # unbuffered: pip's errors (stderr) land in the log after what it printed before them
  PYTHONUNBUFFERED=1 "$PY" -m pip install --disable-pip-version-check "$@" >> "$PIP_LOG" 2>&1
}
pip_or_die() {  # pip_or_die ARGS...: pip_logged; on failure, the log's last lines, and stop
  pip_logged "$@" && return 0
  local status=$?
  {
    printf '[install] pip install %s failed (exit status %s); the last lines of %s:\n' "$*" "$status" "$PIP_LOG"
    tail -n 25 "$PIP_LOG" | sed 's/^/    /'
  } >&2
  die "pip could not install what the lab needs (above; all of pip's output: $PIP_LOG)"
}

# --- 2. torch ----------------------------------------------------------------------------------
CONSTRAINTS="$VENV/constraints.txt"
callers=()  # the caller's PIP_CONSTRAINT: a space-separated list of files, as pip reads it
for f in ${PIP_CONSTRAINT:-}; do
  [[ "$f" = /* ]] || f="$CALLER_PWD/$f"
  callers+=("$f")
done
kept=$("$PY" "$HELPER" constraints "$CONSTRAINTS" "$TESTED" ${callers[@]+"${callers[@]}"})
export PIP_CONSTRAINT="$VENV_ABS/constraints.txt"
TORCH_REQ=$("$PY" "$HELPER" requirement torch "$CONSTRAINTS")
TORCH_REQ=${TORCH_REQ%%#*}; TORCH_REQ=${TORCH_REQ// /}
venv_torch=$("$PY" "$HELPER" torch)

torch_satisfies() {  # does the environment's torch meet the constraint? (the constraint is ==X)
  local want=${TORCH_REQ#torch==}
  [ "$want" = "$TORCH_REQ" ] && return 0  # not an exact pin: any installed torch will do
  set -- $venv_torch
  [ "${2%%+*}" = "${want%%+*}" ]
}

if [ -n "$kept" ]; then
  say "kept as installed: $kept (the tested versions in .ci/constraints.txt do not apply to them)"
elif [ "$venv_torch" != none ] && torch_satisfies; then
  set -- $venv_torch
  say "torch $2 ($1) is installed"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  say "an NVIDIA GPU and no $TORCH_REQ here: installing it from the default index (the CUDA build, several GB with its nvidia-* libraries; pip's output: $PIP_LOG)"
  pip_or_die "$TORCH_REQ"
  say "installed $TORCH_REQ"
else
  say "no GPU and no $TORCH_REQ here: installing its CPU build (~190 MB), asking $CPU_INDEX first (pip's output: $PIP_LOG)"
  if "$PY" "$HELPER" reachable "${CPU_INDEX%/}/torch/" 10 && pip_logged --timeout 30 --index-url "$CPU_INDEX" "$TORCH_REQ"; then
    :
  else
    say "$CPU_INDEX could not be reached (10 s timeout) or has no $TORCH_REQ for this platform: trying the default index (on Linux x86_64 PyPI's torch is the CUDA build, several GB, unless pip is configured to find another)"
    pip_or_die "$TORCH_REQ"
  fi
  say "installed $TORCH_REQ"
fi

# --- 3. the lab ----------------------------------------------------------------------------------
# skipped when nothing it depends on changed since the last install (the stamp records it)
STAMP="$VENV/.rmsnorm_lab-installed"
stamp=$("$PY" -c "import hashlib, sys; print(hashlib.sha256(b''.join(open(f, 'rb').read() for f in sys.argv[1:]) + sys.version.encode()).hexdigest())" pyproject.toml workbook/pyproject.toml "$CONSTRAINTS")
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$stamp" ] && "$PY" -c "import rmsnorm_lab, rmsnorm_workbook" 2>/dev/null; then
  say "the lab and its dependencies are installed (pyproject.toml and the constraints are unchanged)"
else
  say "installing the lab (editable) and its dependencies under $CONSTRAINTS (pip's output: $PIP_LOG)"
  rm -f "$STAMP"
  pip_or_die -e . -e "./workbook[test]"
  printf '%s\n' "$stamp" > "$STAMP"
  say "the lab and its dependencies are installed"
fi

# --- 4. the native autograd node ---------------------------------------------------------------
CXX_BIN=${CXX:-c++}
if ! command -v "$CXX_BIN" >/dev/null 2>&1; then
  say "no C++ compiler ($CXX_BIN) here: the native autograd node is not built; the lab uses its Python autograd node (same results, more host time per call)"
elif ! "$PY" -c "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null; then
  say "no Python headers (Python.h; on Debian/Ubuntu: apt-get install python3-dev): the native autograd node is not built; the lab uses its Python autograd node"
else
  BUILT="${TORCH_EXTENSIONS_DIR:-$VENV_ABS/torch_extensions}/.rmsnorm_lab-native-built"
  if [ -f "$BUILT" ]; then
    say "loading the native autograd node (rebuilt only when its sources or torch changed)..."
  else
    say "building the native autograd node (C++, under a minute, once)..."
  fi
  t0=$SECONDS
  LOG="$VENV/native-build.log"
  if "$PY" -c "from rmsnorm_lab.native import build; build.load()" >"$LOG" 2>&1; then
    mkdir -p "$(dirname "$BUILT")" && touch "$BUILT"
    say "native autograd node ready in $((SECONDS - t0)) s (cached in $VENV/torch_extensions; later runs only load it)"
  else
    rm -f "$BUILT"
    say "the native autograd node did not build ($(grep -v '^\s*$' "$LOG" | tail -n 1 | cut -c1-160)); the lab uses its Python autograd node; full output: $LOG"
  fi
fi

"$PY" - <<'EOF'
import torch, rmsnorm_lab
build = f"CUDA {torch.version.cuda}" if torch.version.cuda else ("ROCm " + torch.version.hip if torch.version.hip else "CPU")
print(f"[install] ready: rmsnorm_lab {rmsnorm_lab.__version__}, torch {torch.__version__} ({build}), "
      f"GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
EOF
say "done in $((SECONDS - started)) s. Run the lab with $VENV/bin/python -m rmsnorm_lab (or: source $VENV/bin/activate)"
