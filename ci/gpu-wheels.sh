#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels ci/gpu-check.sh installs on a GPU machine that has no
# network (Python 3.12, x86-64): MPICH, mpi4py and pytest-mpi. They land in .whl/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
py=${PYTHON:-python3}
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl mpich==5.0.2 mpi4py==4.1.2 pytest-mpi==0.6 2>&1 | grep -v "^WARNING: Location" || true
ls -la .whl
